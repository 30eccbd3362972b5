"""The serve pipeline: the plan, the files it needs, the argv it runs, and the processes it supervises."""
