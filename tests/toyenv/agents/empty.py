"""Toy empty control: no reply."""
