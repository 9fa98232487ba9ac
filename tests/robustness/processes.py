"""Process-group helpers for the tests that kill a run (a plain module beside them)."""
import os


def group_alive(pgid: int) -> bool:
    """Does a live (not zombie) process of the process group ``pgid`` remain? Reads /proc."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies still count for killpg; look for members that are not.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
