"""Golden-image building and publishing on a host, local or over SSH, and the proof that a built image boots
(``verify``): the library behind ``osfleet image`` and the Fabric tasks in ``golden_images/``."""
