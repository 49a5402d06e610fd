import os
import sys

_value = os.environ.get("ADP_SWITCH_S")
if _value:
    sys.setswitchinterval(float(_value))
