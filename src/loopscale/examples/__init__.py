"""Example looped techniques that are not in the paper; each is a file a user could have written (docs/extending.md)."""
