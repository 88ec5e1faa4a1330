"""Token and attention fidelity: how close merged tokens and ToMA outputs stay to the exact ones."""
