"""Data cleaning: duplicates (exact and MinHash), quality rules, language, decontamination."""
