"""Python API: ``pipeline()`` and its sessions."""
