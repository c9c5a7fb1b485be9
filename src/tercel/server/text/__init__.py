"""The front end of Kestrel's text protocol (``text_port``): :mod:`.connection`."""
