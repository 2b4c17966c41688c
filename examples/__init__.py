"""Small agents built on hermes: each module here is a toolset for `python -m worker --tools`."""
