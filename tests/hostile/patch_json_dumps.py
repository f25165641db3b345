# expect: tamper|forbidden|starter
# 改 json.dumps / json.dump：评分器在本进程里把结果序列化成 JSON（旧评分器还在序列化之后才签名）。
# 把 json 模块的这两个函数换掉，任何带 peak/hwm/rss 字段的字典在序列化时都被改成 60%、violations 清空。
# 训练本身是起始代码的显存。
# Patch json.dumps / json.dump so that the grader serialises a lowered peak (and signs it).
# 旧评分器（1b67139：进程内审计钩子 + HMAC 签名）上：攻破：改过的结果被用真密钥签了名（满分）。
import json

import torch


def _lower(obj, strings=True):
    """The same result with every peak / RSS figure at 60 % and no violations."""
    if isinstance(obj, dict):
        return {k: (int(v * 0.6) if isinstance(v, (int, float)) and not isinstance(v, bool)
                    and any(w in k.lower() for w in ("peak", "hwm", "rss")) else [] if k == "violations" else _lower(v, strings))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_lower(x, strings) for x in obj]
    if strings and isinstance(obj, str) and obj.startswith("{"):
        try:
            return json.dumps(_lower(json.loads(obj)), sort_keys=True, ensure_ascii=False)
        except ValueError:
            return obj
    return obj


_real_dumps, _real_dump = json.dumps, json.dump


def _dumps(obj, *args, **kwargs):
    return _real_dumps(_lower(obj, strings=False) if isinstance(obj, dict) else obj, *args, **kwargs)


def _dump(obj, fp, *args, **kwargs):
    return _real_dump(_lower(obj, strings=False) if isinstance(obj, dict) else obj, fp, *args, **kwargs)


json.dumps, json.dump = _dumps, _dump


def _plain_step(model, optimizer, batch):
    """The starter's memory: 2 halves whose graphs both live until one backward (2 forwards per step)."""
    n = batch.shape[0]
    loss = sum(model(input_ids=c, labels=c).loss * (c.shape[0] / n) for c in batch.split(n // 2))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train_step(model, optimizer, batch, device):
    return _plain_step(model, optimizer, batch)
