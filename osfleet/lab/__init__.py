"""A lab of bare-metal hosts on one machine: network namespaces with their own address, sshd, state folder
and replica-name prefix, all sharing this machine's libvirtd, so Pulumi and fleet tests run against them
exactly as against real servers."""
