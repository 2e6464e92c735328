"""Reading a run: its report (`run`) and the comparison of two profiles' runs (`profiles`)."""
