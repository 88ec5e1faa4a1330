"""Speed benches: ms per model call, ToMA against unpatched in the same run."""
