"""Golden-image building and publishing on a host, local or over SSH (the library behind ``osfleet image``
and the Fabric tasks in ``golden_images/``)."""
