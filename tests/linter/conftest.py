import os
import sys

# ruletest.py is a plain helper module next to the tests.
sys.path.insert(0, os.path.dirname(__file__))
