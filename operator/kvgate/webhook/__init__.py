"""The admission webhook's server, I/O: HTTPS on aiohttp with reloading certificates
(``app.py``, ``certificates.py``), its metrics, ``kvgate webhook`` (``webhook_command.py``) and the
operator's own in-process webhook (``operator_webhook.py``). What it answers is decided by the
pure checks of :mod:`kvgate.admission`."""
