"""What manipulating clients get from the books (one attacker at a time)."""
