"""Writes the generated tables and pictures into docs/ and assets/ (never into README.md)."""
