"""Empty control: leaves no reply."""
