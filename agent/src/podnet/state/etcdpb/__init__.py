# SPDX-License-Identifier: Apache-2.0
"""etcd's gRPC messages, built at import from the descriptor set in `_descriptor.py`
(generated from etcd's own .proto files: agent/artifacts/gen-etcdpb.py), with the
`protobuf` runtime's message factory: no generated Python code, so any protobuf 4.22+
runtime (upb) loads it."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from podnet.state.etcdpb._descriptor import DATA, VERSION

__all__ = ["VERSION", "message"]

_pool = descriptor_pool.DescriptorPool()
for _f in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(DATA)).file:
    _pool.Add(_f)


def message(name: str) -> Any:
    """The message class `name` (`etcdserverpb.RangeRequest`, `mvccpb.KeyValue`...)."""
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(name))
