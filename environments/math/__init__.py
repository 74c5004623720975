"""Math word-problem environment (GSM8K, MATH) with answer verification in a process pool."""
