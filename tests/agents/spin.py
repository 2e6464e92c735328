"""An infinite CPU loop."""
while True:
    pass
