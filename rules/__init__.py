"""The rule modules, one per rule; discovered by ``torchlint.registry``."""
