"""The KV connector's worker half (prefill/decode disaggregation); the scheduler half is src/kv-connector/."""

from .connector import KvConnectorWorker, LoadReport
from .transport import KvTransport, TorchDistributedTransport, TransferHandle

__all__ = ["KvConnectorWorker", "KvTransport", "LoadReport", "TorchDistributedTransport", "TransferHandle"]
