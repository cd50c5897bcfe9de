"""After a verdict: what to say of it (advice), a server log read the way the gate reads it
(diagnose), and what recovery tries next (decisions)."""
