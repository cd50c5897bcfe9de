"""The experiment commands, sweep and bisect, and the trials they share."""
