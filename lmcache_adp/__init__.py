"""lmcache-adp's LMCache plugin: load it with

``--l2-adapter '{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector",
"adapter_params":{}}'`` (the gateway's default socket; see plugin_manifest.yaml for the params)
"""

from lmcache_adp.connector import ADPConnector

__all__ = ["ADPConnector"]
