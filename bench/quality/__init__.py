"""The quality study on trained fixtures, and the fixture training itself."""
