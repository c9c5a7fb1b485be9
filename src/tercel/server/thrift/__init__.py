"""The front end of Kestrel's Thrift service (``thrift_port``): :mod:`.connection`."""
