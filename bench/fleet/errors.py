# The one kind of user error (a bad flag, file or trace): the command line prints it as one
# line and exits 2.


class FleetError(Exception):
    """A user error (bad flag, file or trace): printed as one line, exit 2."""
