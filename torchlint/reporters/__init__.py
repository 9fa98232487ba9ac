"""Output formats for lint findings; see ``torchlint.reporters.registry``."""
