"""Run ``python -m app ARGS`` in-process and expect bad input: one line on stderr, exit status 2."""

from app.cli import main


def usage_error(capsys, *args: str) -> str:
    """The error line of ``app ARGS``; asserts exit status 2 and a single ``error: ...`` line."""
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err
