"""What several test modules share. A test module imports its helpers from here (or from tests.conftest, tests.paths
and the fakes beside them), never from another test module."""
