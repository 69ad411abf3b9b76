"""Generated blocks of the papers and the README results block, read from data/measurements."""
