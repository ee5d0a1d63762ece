# rdma-core's Python test suite as its run_tests.py runs it (same loader, same arguments), with
# one machine-readable line per outcome besides unittest's own verbose output, for
# scripts/qemu-rdma-core-tests.sh:
#   RCT pass|fail|error|skip|xfail|xpass TEST-ID :: REASON (skips) or last line of the traceback
# Usage (in the guest): python3 rdma-core-tests.py --dev DEVICE [-v] [TEST...]
import os
import sys
import traceback
import unittest
from importlib.machinery import SourceFileLoader

TESTS = '/usr/share/rdma-core/tests'
sys.path.insert(0, TESTS)
os.chdir(TESTS)
from args_parser import parser  # noqa: E402 (rdma-core's tests directory, above)

tests = SourceFileLoader('tests', os.path.join(TESTS, '__init__.py')).load_module()
parser.parse_args()

# RCT_NO_RDMA_CM=REASON: the device has no rdma_cm (no GSI QP), which the suite does not check
# before it connects; its rdma_cm tests are skipped with REASON, as a skip decorator on their
# classes would.
if os.environ.get('RCT_NO_RDMA_CM'):
    for mod in tests.__test_modules__:
        if mod.__name__.endswith('.test_rdmacm'):
            for obj in vars(mod).values():
                if isinstance(obj, type) and issubclass(obj, unittest.TestCase) and \
                        obj.__module__ == mod.__name__:
                    obj.__unittest_skip__ = True
                    obj.__unittest_skip_why__ = os.environ['RCT_NO_RDMA_CM']


def emit(kind, test, why=''):
    why = ' '.join(str(why).split())
    print(f'RCT {kind} {test.id()} :: {why}', flush=True)


def last_line(result, err):
    text = ''.join(traceback.format_exception_only(err[0], err[1])).strip().splitlines()
    return text[-1] if text else ''


class Result(unittest.TextTestResult):
    """unittest's verbose result, also printing the RCT lines."""

    def addSuccess(self, test):
        super().addSuccess(test)
        emit('pass', test)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        emit('fail', test, last_line(self, err))

    def addError(self, test, err):
        super().addError(test, err)
        emit('error', test, last_line(self, err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        emit('skip', test, reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        emit('xfail', test, last_line(self, err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        emit('xpass', test)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = 'fail' if issubclass(err[0], test.failureException) else 'error'
            emit(kind, subtest, last_line(self, err))


unittest.main(module=tests, testRunner=unittest.TextTestRunner(resultclass=Result, verbosity=2))
