"""``python -m raftmq``: the same command as the ``raftmq`` script, for when the script is not
on PATH (a bare checkout, a venv that is not activated)."""

from raftmq.cli.main import app

if __name__ == "__main__":
    app(prog_name="raftmq")
