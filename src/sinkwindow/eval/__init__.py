"""Long-context evaluation: data generators, scorers and runners."""
