"""Tools that check or measure the package on real hardware (not part of the op or the runtime)."""
