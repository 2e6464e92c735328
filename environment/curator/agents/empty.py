"""Empty control: leaves no reply at all."""
