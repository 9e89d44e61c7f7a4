# Tests of the warren Python SDK. Run from the repository root:
#   python3 -m unittest discover -s sdk/python/tests
# or from sdk/python:  python3 -m unittest discover -s tests -t .
