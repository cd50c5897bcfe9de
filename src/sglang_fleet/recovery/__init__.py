"""After a failed verdict: what recovery tries next, the outcome ledger and the crash-loop
guard (decisions), and a server log read the way the gate reads it (diagnose)."""
