"""The exception hierarchy: pickling (PySpark and multiprocessing ship exceptions between
processes), the E_* code mapping, flags and the class tree.
"""

from __future__ import annotations

import builtins
import inspect
import pickle

import pytest

from nsq_sync import errors
from nsq_sync.errors import (
    AuthError,
    ConfigError,
    ConnectionClosed,
    ConnectTimeout,
    FrameTooLarge,
    HandshakeError,
    HTTPAPIError,
    InvalidBody,
    InvalidName,
    LocalProtocolError,
    LookupdError,
    NSQConnectionError,
    NSQError,
    ProtocolError,
    PublishError,
    ReadTimeout,
    RemoteProtocolError,
    RequeueMessage,
    ServerAuthDisabled,
    ServerAuthError,
    ServerAuthFailed,
    ServerAuthFirst,
    ServerBadBody,
    ServerBadChannel,
    ServerBadMessage,
    ServerBadTopic,
    ServerDPubFailed,
    ServerError,
    ServerFinFailed,
    ServerIdentifyFailed,
    ServerInvalid,
    ServerMPubFailed,
    ServerPubFailed,
    ServerReqFailed,
    ServerSubFailed,
    ServerTouchFailed,
    ServerUnauthorized,
    Stopped,
    TLSError,
    error_from_frame,
)

ALL_CLASSES = sorted(
    (
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == errors.__name__
    ),
    key=lambda cls: cls.__name__,
)

SERVER_ERRORS = [cls for cls in ALL_CLASSES if issubclass(cls, ServerError)]

#: every code nsqd sends that the module maps to its own class
CODES = {
    "E_INVALID": ServerInvalid,
    "E_BAD_BODY": ServerBadBody,
    "E_BAD_TOPIC": ServerBadTopic,
    "E_BAD_CHANNEL": ServerBadChannel,
    "E_BAD_MESSAGE": ServerBadMessage,
    "E_PUB_FAILED": ServerPubFailed,
    "E_MPUB_FAILED": ServerMPubFailed,
    "E_DPUB_FAILED": ServerDPubFailed,
    "E_SUB_FAILED": ServerSubFailed,
    "E_IDENTIFY_FAILED": ServerIdentifyFailed,
    "E_AUTH_FAILED": ServerAuthFailed,
    "E_UNAUTHORIZED": ServerUnauthorized,
    "E_AUTH_DISABLED": ServerAuthDisabled,
    "E_AUTH_FIRST": ServerAuthFirst,
    "E_AUTH_ERROR": ServerAuthError,
    "E_FIN_FAILED": ServerFinFailed,
    "E_REQ_FAILED": ServerReqFailed,
    "E_TOUCH_FAILED": ServerTouchFailed,
}

NON_FATAL = {ServerFinFailed, ServerReqFailed, ServerTouchFailed}
RETRIABLE = {
    ServerPubFailed,
    ServerMPubFailed,
    ServerDPubFailed,
    ServerSubFailed,
    ServerAuthFailed,
    ServerAuthError,
}


def _sample(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` with every constructor argument set to a non-default value."""
    if issubclass(cls, ServerError):
        return cls(cls.code if cls is not ServerError else "E_SOMETHING_NEW", "some text")
    if issubclass(cls, ConnectionClosed):
        return cls("closed by us", "127.0.0.1:4150", by_server=False)
    if issubclass(cls, NSQConnectionError):
        return cls("it broke", "127.0.0.1:4150")
    if issubclass(cls, HTTPAPIError):
        return cls("request failed", url="http://127.0.0.1:4151/pub", status=500, body="oops")
    if issubclass(cls, PublishError):
        return cls("publish failed", reason=ServerPubFailed("E_PUB_FAILED", "disk full"))
    if issubclass(cls, RequeueMessage):
        return cls(delay=2.5, backoff=False)
    return cls("something is wrong")


def _round_trip(exc: BaseException) -> BaseException:
    return pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))


def test_the_module_defines_many_exception_classes() -> None:
    assert len(ALL_CLASSES) >= 40
    assert {cls.__name__ for cls in ALL_CLASSES} <= set(errors.__all__)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_every_exception_survives_pickle(cls: type[BaseException], protocol: int) -> None:
    exc = _sample(cls)
    copy = pickle.loads(pickle.dumps(exc, protocol=protocol))
    assert type(copy) is cls
    assert str(copy) == str(exc)
    assert repr(copy) == repr(exc)
    for name, value in vars(exc).items():
        copied = getattr(copy, name)
        if isinstance(value, BaseException):
            assert type(copied) is type(value)
            assert copied.args == value.args
        else:
            assert copied == value, name


def test_server_error_attributes_survive_pickle() -> None:
    copy = _round_trip(ServerBadTopic("E_BAD_TOPIC", 'PUB topic name "x!" is not valid'))
    assert isinstance(copy, ServerBadTopic)
    assert copy.code == "E_BAD_TOPIC"
    assert copy.text == 'PUB topic name "x!" is not valid'
    assert copy.fatal is True
    assert copy.retriable is False
    fin = _round_trip(ServerFinFailed("E_FIN_FAILED", "FIN failed"))
    assert isinstance(fin, ServerFinFailed)
    assert fin.fatal is False


def test_unknown_code_survives_pickle() -> None:
    copy = _round_trip(error_from_frame(b"E_NEW_THING text"))
    assert type(copy) is ServerError
    assert copy.code == "E_NEW_THING"
    assert copy.text == "text"


def test_connection_error_attributes_survive_pickle() -> None:
    closed = _round_trip(ConnectionClosed("bye", "127.0.0.1:4150", by_server=False))
    assert isinstance(closed, ConnectionClosed)
    assert closed.address == "127.0.0.1:4150"
    assert closed.by_server is False
    timeout = _round_trip(ConnectTimeout("dial timed out", "10.0.0.1:4150"))
    assert isinstance(timeout, ConnectTimeout)
    assert isinstance(timeout, TimeoutError)
    assert timeout.address == "10.0.0.1:4150"
    assert str(timeout) == "dial timed out (10.0.0.1:4150)"


def test_http_error_attributes_survive_pickle() -> None:
    copy = _round_trip(
        LookupdError("lookup failed", url="http://l:4161/lookup", status=404, body="x")
    )
    assert isinstance(copy, LookupdError)
    assert (copy.url, copy.status, copy.body) == ("http://l:4161/lookup", 404, "x")


def test_publish_error_reason_survives_pickle() -> None:
    copy = _round_trip(PublishError("no nsqd took it", reason=ConnectTimeout("t", "h:1")))
    assert isinstance(copy, PublishError)
    assert isinstance(copy.reason, ConnectTimeout)
    assert copy.reason.address == "h:1"


def test_requeue_message_attributes_survive_pickle() -> None:
    copy = _round_trip(RequeueMessage(delay=10.0, backoff=False))
    assert isinstance(copy, RequeueMessage)
    assert (copy.delay, copy.backoff) == (10.0, False)
    default = _round_trip(RequeueMessage())
    assert isinstance(default, RequeueMessage)
    assert (default.delay, default.backoff) == (None, True)


# --------------------------------------------------------------------------- error_from_frame


def test_code_table_covers_every_server_error_class() -> None:
    mapped = set(CODES.values())
    assert {cls for cls in SERVER_ERRORS if cls is not ServerError} == mapped
    assert {cls.code for cls in mapped} == set(CODES)


def _server_name(code: str) -> str:
    words = [w.capitalize() for w in code.removeprefix("E_").split("_")]
    return "Server" + "".join({"Mpub": "MPub", "Dpub": "DPub"}.get(w, w) for w in words)


@pytest.mark.parametrize(("code", "cls"), sorted(CODES.items()))
def test_server_error_classes_are_named_server_plus_their_code(
    code: str, cls: type[ServerError]
) -> None:
    # The naming rule of the module docstring: a reader tells an error nsqd sent (Server*) from
    # one nsq_sync raised before sending (InvalidName, InvalidBody, ConfigError) by its name.
    assert cls.__name__ == _server_name(code)
    assert cls.__name__ in errors.__all__


def test_client_side_validation_errors_are_not_server_errors() -> None:
    for cls in (InvalidName, InvalidBody, ConfigError, LocalProtocolError):
        assert not issubclass(cls, ServerError)
        assert not cls.__name__.startswith("Server")


@pytest.mark.parametrize(("code", "cls"), sorted(CODES.items()))
def test_error_from_frame_maps_each_code(code: str, cls: type[ServerError]) -> None:
    exc = error_from_frame(code.encode() + b" what nsqd said")
    assert type(exc) is cls
    assert exc.code == code
    assert exc.text == "what nsqd said"
    assert str(exc) == f"{code} what nsqd said"
    assert exc.fatal is (cls not in NON_FATAL)
    assert exc.retriable is (cls in RETRIABLE)


def test_error_from_frame_without_text() -> None:
    exc = error_from_frame(b"E_INVALID")
    assert type(exc) is ServerInvalid
    assert exc.text == ""
    assert str(exc) == "E_INVALID"


def test_unknown_code_becomes_a_fatal_server_error_keeping_the_code() -> None:
    exc = error_from_frame(b"E_BAD_PROTOCOL unknown magic")
    assert type(exc) is ServerError
    assert exc.code == "E_BAD_PROTOCOL"
    assert exc.text == "unknown magic"
    assert exc.fatal is True
    assert "E_BAD_PROTOCOL" in str(exc)


@pytest.mark.parametrize("data", [b"", b" ", b"\xff\xfe garbage", b"not an error code"])
def test_error_from_frame_never_raises(data: bytes) -> None:
    exc = error_from_frame(data)
    assert isinstance(exc, ServerError)
    assert exc.code


def test_empty_frame_gets_the_unknown_code() -> None:
    assert error_from_frame(b"").code == "E_UNKNOWN"


def test_server_error_defaults_to_its_class_code() -> None:
    assert ServerBadTopic().code == "E_BAD_TOPIC"
    assert ServerError().code == "E_UNKNOWN"


# --------------------------------------------------------------------------- hierarchy


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda cls: cls.__name__)
def test_everything_is_an_nsq_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, NSQError)
    assert issubclass(cls, Exception)


@pytest.mark.parametrize("cls", [ConfigError, InvalidName, InvalidBody])
def test_input_errors_are_value_errors(cls: type[Exception]) -> None:
    assert issubclass(cls, ValueError)
    with pytest.raises(ValueError):
        raise cls("bad input")


@pytest.mark.parametrize("cls", [ConnectTimeout, ReadTimeout])
def test_timeouts_are_builtin_timeout_errors(cls: type[NSQConnectionError]) -> None:
    assert issubclass(cls, TimeoutError)
    assert issubclass(cls, NSQConnectionError)
    with pytest.raises(TimeoutError):
        raise cls("timed out", "127.0.0.1:4150")


def test_connection_errors_do_not_shadow_builtins() -> None:
    for name in errors.__all__:
        assert not hasattr(builtins, name), name
    assert not issubclass(NSQConnectionError, builtins.ConnectionError)


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        (ConnectionClosed, NSQConnectionError),
        (HandshakeError, NSQConnectionError),
        (TLSError, HandshakeError),
        (AuthError, HandshakeError),
        (LocalProtocolError, ProtocolError),
        (RemoteProtocolError, ProtocolError),
        (FrameTooLarge, RemoteProtocolError),
        (LookupdError, HTTPAPIError),
        (ServerBadTopic, ServerError),
        (ServerFinFailed, ServerError),
    ],
)
def test_hierarchy(child: type[Exception], parent: type[Exception]) -> None:
    assert issubclass(child, parent)


def test_unrelated_branches_stay_apart() -> None:
    assert not issubclass(ServerError, NSQConnectionError)
    assert not issubclass(ProtocolError, NSQConnectionError)
    assert not issubclass(LocalProtocolError, RemoteProtocolError)
    assert not issubclass(Stopped, NSQConnectionError)
    assert not issubclass(RequeueMessage, ServerError)


# --------------------------------------------------------------------------- messages


def test_connection_error_message_names_the_address() -> None:
    assert str(NSQConnectionError("refused", "127.0.0.1:4150")) == "refused (127.0.0.1:4150)"
    assert str(NSQConnectionError("refused")) == "refused"
    closed = ConnectionClosed()
    assert closed.by_server is True
    assert str(closed) == "connection closed"


def test_publish_error_message_includes_the_reason() -> None:
    exc = PublishError("publish failed", reason=ServerPubFailed("E_PUB_FAILED", "exiting"))
    assert "publish failed" in str(exc)
    assert "E_PUB_FAILED" in str(exc)
    assert str(PublishError("publish failed")) == "publish failed"


def test_http_error_message_includes_url_status_and_body() -> None:
    text = str(HTTPAPIError("failed", url="http://h:4151/pub", status=500, body="boom"))
    assert "http://h:4151/pub" in text
    assert "500" in text
    assert "boom" in text
