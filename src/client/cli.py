"""Scriptable subcommands: ``ask``, ``sessions``, ``prompt``, ``history``, ``search``, ``export``,
``rename``, ``clear``, ``delete``/``restore``/``purge``, ``clients``, ``memory list|forget``, ``kb``
(``client.kb_cli``; see docs/client.md).

Each command is an async function taking the parsed arguments and the loaded config and returning
an exit code. Output: human-readable text by default; with ``--json`` exactly one JSON document on
stdout. Errors go to stderr as ``nplt-client: CODE: message`` with a stable exit code. Both
streams show control characters as ``\\uXXXX`` (``PrintableWriter``): the server's text never
controls the terminal.
"""
from __future__ import annotations

import argparse
import asyncio
import codecs
import io
import json
import os
import re
import sys
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from protocol import ErrorCode, MsgType
from protocol.messages import MAX_PROMPT_CHARS
from protocol.objects import ChatMessage, SessionInfo, ToolCall
from protocol.server_events import (AnswerDelta, SessionEvent, ToolCallEvent, TurnEnd, TurnError, TurnEvent,
                                    TurnStart)

from client import errors, files
from client import kb as kbclient
from client.config import ClientConfig
from client.connection import Backoff, Client
from client.errors import ClientCode, ClientError
from client.events import Disconnected, ServerError
from client.kb_cli import STANDARD_STREAMS, add_kb_parser, cmd_kb, dump_json as _dump
from client.kb_cli import check_standard_stream
from client.turn_errors import error_line
from client.wording import counted, printable, stamp

EXIT_OK = 0
EXIT_INTERNAL = 1      # unexpected failure (a bug)
EXIT_USAGE = 2         # bad arguments or configuration
EXIT_CONNECTION = 3    # cannot connect, TLS failure, connection lost, timeout, server full / shutting down
EXIT_AUTH = 4          # AUTH_FAILED
EXIT_REQUEST = 5       # the server rejected the request (NOT_FOUND, INVALID_MESSAGE, QUEUE_FULL, ...)
EXIT_TURN = 6          # the turn failed (TURN_ERROR) or was cancelled
EXIT_INTERRUPTED = 130  # Ctrl+C
EXIT_HANGUP = 129      # SIGHUP (the terminal closed): 128 + 1, as a shell reports it
EXIT_TERMINATED = 143  # SIGTERM (`timeout`, `kill`, systemd): 128 + 15
#: how long a stopped ``ask`` (Ctrl+C, SIGTERM/SIGHUP, stdout gone) waits for the server to confirm
#: the cancel of its turn before it exits anyway
CANCEL_WAIT_S = 2.0
#: ``ask -`` takes at most this many times the server's ``max_text_chars`` (HELLO ``limits``) characters
#: of stdin: a text somewhat over the limit is refused as the same text given as an argument is
#: (INVALID_MESSAGE, exit 5, saying how long it is), a longer one is a usage error (exit 2)
STDIN_READ_FACTOR = 4
#: the ``max_text_chars`` assumed when a server announces none: the most any server can be set to
STDIN_DEFAULT_TEXT_CHARS = 10_000_000
#: ``ask -`` reads stdin whole before it connects (a slow producer, ``(sleep 60; date) | ask -``,
#: neither holds a connection and a ``max_clients`` slot meanwhile nor loses its message when the
#: server restarts in between), at most this many characters: the most any server's ``max_text_chars``
#: can be. More is a usage error (exit 2) without reading the rest: a flood (``ask - < big.log``) is
#: not read whole into memory first
STDIN_ASK_CHARS = STDIN_DEFAULT_TEXT_CHARS
#: ``prompt -`` reads at most this many characters of stdin (``STDIN_READ_FACTOR`` x the protocol's
#: longest system prompt, ``protocol.messages.MAX_PROMPT_CHARS``)
STDIN_PROMPT_CHARS = STDIN_READ_FACTOR * MAX_PROMPT_CHARS
#: bytes of a CHAT_TEXT request besides its text (id, field names, session id, frame header): the
#: message is checked against the server's ``max_message_size`` with this much room
REQUEST_ENVELOPE_BYTES = 1024
#: the largest message id / cursor / connection id an argument may name: the protocol's integers
#: are 64-bit (``history --before 99999999999999999999999`` is a usage error, not an encoding failure)
MAX_INTEGER_ARGUMENT = (1 << 63) - 1
#: how ``history`` marks an answer the server stopped while shutting down (``cancel_reason``), as the TUI does
CANCEL_REASON_MARKS = {"shutdown": "stopped: the server shut down"}
#: the mark the server ends a text with when it cut it to fit ``max_message_size`` (docs/protocol.md §3)
CUT_MARK = re.compile(r"\n\[\.\.\. cut by the server to fit max_message_size: \d+ more characters\]$")

CONNECTION_SERVER_CODES = frozenset({ErrorCode.SERVER_FULL, ErrorCode.SHUTTING_DOWN, ErrorCode.UNSUPPORTED_VERSION,
                                     ErrorCode.HANDSHAKE_TIMEOUT, ErrorCode.HANDSHAKE_REQUIRED, ErrorCode.IDLE_TIMEOUT,
                                     ErrorCode.SLOW_CONSUMER})


def exit_code_for(exc: ClientError) -> int:
    """The stable exit code for a client error."""
    if exc.code is ErrorCode.AUTH_FAILED:
        return EXIT_AUTH
    if exc.code in errors.LOCAL_FILE_CODES:
        return EXIT_USAGE
    if exc.is_connection_error or exc.code in CONNECTION_SERVER_CODES:
        return EXIT_CONNECTION
    return EXIT_REQUEST


class WriteFailed(Exception):
    """A stream cannot take the output (closed: ``>&-``; a full disk: ``> /dev/full``; an I/O error):
    ``nplt-client: WRITE_FAILED: stdout: reason``, exit 2. A reader that went away (``| head``) is
    ``BrokenPipeError`` instead: a quiet exit 0."""

    def __init__(self, stream: str, reason: str) -> None:
        super().__init__(f"{stream}: {reason}")


def _unicode_encoding(raw: Any) -> bool:
    """Whether ``raw``'s encoding holds every character (UTF-8, UTF-16, ...; a stream without an
    encoding, e.g. a StringIO, holds text)."""
    encoding = getattr(raw, "encoding", None)
    if not encoding:
        return True
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


class PrintableWriter:
    """A text stream writing ``printable(text)`` to ``raw``: ``run_command`` wraps stdout and stderr
    in one, so every print path shows the server's control characters instead of running them.
    ``raw`` is for the CLI's own terminal drawing only (the upload progress bar's carriage return).

    A character the stream's encoding cannot hold (``PYTHONIOENCODING=latin-1``, an ASCII locale) is
    written as its backslash escape (``\\u4e2d``) instead of failing; ``ascii_json`` tells
    ``dump_json`` to escape JSON text the same lossless way. A stream that cannot be written (None
    when the shell closed it, a full disk, an I/O error) raises ``WriteFailed``; with ``quiet`` (stderr,
    the last place to report anything) its failures are dropped instead."""

    def __init__(self, raw: TextIO | None, name: str = "stdout", *, quiet: bool = False) -> None:
        self.raw = raw
        self.name = name
        self.quiet = quiet
        self.ascii_json = not _unicode_encoding(raw)

    def check(self) -> None:
        """``WriteFailed`` now when the stream is closed (before a command starts work for nobody)."""
        if self.raw is None or getattr(self.raw, "closed", False):
            raise WriteFailed(self.name, "closed")

    def write(self, text: str) -> int:
        self._guard(self._write, printable(text))
        return len(text)

    def flush(self) -> None:
        if self.raw is not None:          # nothing was written to a closed stream (write raised)
            self._guard(self.raw.flush)

    def isatty(self) -> bool:
        try:
            return self.raw is not None and self.raw.isatty()
        except (OSError, ValueError):
            return False

    def _write(self, text: str) -> None:
        self.check()
        assert self.raw is not None
        try:
            self.raw.write(text)
        except UnicodeEncodeError:        # nothing of ``text`` was written: the encoding failed first
            encoding = getattr(self.raw, "encoding", None) or "ascii"
            self.raw.write(text.encode(encoding, "backslashreplace").decode(encoding))

    def _guard(self, op: Any, *args: Any) -> None:
        try:
            try:
                op(*args)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise WriteFailed(self.name, exc.strerror or str(exc)) from exc
            except ValueError as exc:     # "I/O operation on closed file"
                raise WriteFailed(self.name, str(exc)) from exc
        except (WriteFailed, BrokenPipeError):
            if not self.quiet:
                raise


def make_client(cfg: ClientConfig, session_id: str | None = None) -> Client:
    """A non-reconnecting client for one command."""
    return Client(cfg.host, cfg.port, token=cfg.token, tls=cfg.tls.context(), client_name="nplt-cli/0.1",
                  session_id=session_id, reconnect=False, backoff=Backoff(max_attempts=0),
                  request_timeout=cfg.request_timeout_s, connect_timeout=cfg.connect_timeout_s,
                  event_queue_size=cfg.event_queue_size, liveness_timeout=cfg.liveness_timeout_s)


def _arguments(call: ToolCall) -> str:
    """A tool call's arguments on one line, for people: Chinese (any non-ASCII text) as written, not \\uXXXX."""
    return json.dumps(call.arguments, ensure_ascii=False)


def _need_session(client: Client, session_id: str | None) -> None:
    """A command on the most recently updated session by a user who has none: NOT_FOUND, saying how
    to start one (the server's own message names protocol requests)."""
    if session_id is None and client.session_id is None:
        raise ClientError(ErrorCode.NOT_FOUND,
                          'no current session, you have none yet: nplt-client ask "your message" starts one')


async def _check_model(client: Client, name: str) -> str | None:
    """UNKNOWN_MODEL unless the server offers ``name``: asked before anything is created or sent.
    Returns the server's default model (None when it marks none)."""
    models = (await client.model_list()).models
    offered = [m.name for m in models]
    if name not in offered:
        raise ClientError(ErrorCode.UNKNOWN_MODEL,
                          f"model {name!r} is not offered (available: {', '.join(offered) or 'none'})")
    return next((m.name for m in models if m.default), None)


async def cmd_ask(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Send one message (``-``: read it from stdin) and stream the answer; with --json print one
    document at the end.

    A refused ask changes nothing: the text is checked against the server's limits (HELLO) before
    any session is made or changed, and when the server still refuses the message after
    ``--new``/``--model``/``--system`` took effect, those are undone (``AskSetup``)."""
    from_stdin = args.text == "-"
    text: str | None = args.text
    if from_stdin:
        _check_stdin()                  # a closed stdin: a usage error before anything else
    elif not args.text.strip():
        raise UsageError(EMPTY_MESSAGE)
    _check_prompt_argument(args.system, "--system")
    if isinstance(out, PrintableWriter):
        out.check()       # a closed stdout (>&-): WRITE_FAILED before a turn generates for nobody
    if from_stdin:
        # read whole before connecting (STDIN_ASK_CHARS): a slow producer holds no connection meanwhile,
        # and a server restarted while it writes still gets the message
        text = await _text_or_stdin("-", STDIN_ASK_CHARS, "the most any server's max_text_chars can be")
        if text is None or not text.strip():
            raise UsageError(EMPTY_MESSAGE)
    assert text is not None
    async with make_client(cfg, session_id=args.session) as client:
        limits = client.hello.limits if client.hello is not None else {}
        if from_stdin and len(text) > stdin_cap(limits):      # far over the server's limit: a usage error
            cap = stdin_cap(limits)
            raise UsageError(stdin_too_long(cap, f"{STDIN_READ_FACTOR} x the server's max_text_chars, "
                                                 f"{cap // STDIN_READ_FACTOR}"))
        check_message(text, limits)     # over the server's limits: refused before anything changes
        if args.session and client.session_id != args.session:
            await client.session_switch(args.session)  # NOT_FOUND when it is not the user's session
        default_model = None
        if args.model:
            default_model = await _check_model(client, args.model)   # a wrong name leaves no new session behind
        setup = AskSetup(client, default_model)
        try:
            reply, turn_id = await _send(client, args, text, setup)
        except ClientError as exc:
            if not exc.is_connection_error:      # refused: what this command set up is undone
                await setup.undo(err)
            raise
        started: list[TurnStart] = []
        try:
            streamed = io.StringIO() if args.json else out   # --json: kept for a cut TURN_END
            end = await _follow_turn(client, turn_id, streamed, None if args.json else err, started)
        except (asyncio.CancelledError, BrokenPipeError, WriteFailed) as stop:
            # Ctrl+C, SIGTERM/SIGHUP (client.main), stdout's reader left (`| head`) or stdout cannot
            # be written: the turn is cancelled, so the answer is not generated for nobody
            try:
                await asyncio.wait_for(client.chat_cancel(turn_id=turn_id), CANCEL_WAIT_S)
            except (ClientError, asyncio.TimeoutError) as exc:
                # it ended meanwhile (NO_ACTIVE_TURN), or the reply is still behind the answer's deltas
                # (the request went out): said on stderr, except for a closed pipe, which ends quietly
                ended = isinstance(exc, ClientError) and exc.code == ErrorCode.NO_ACTIVE_TURN
                if not ended and not isinstance(stop, BrokenPipeError):
                    err.write(f"nplt-client: {cancel_failed(exc)}\n")
            raise
    if isinstance(end, TurnError):
        err.write(f"nplt-client: {end.code}: {end.message}\n")
        return EXIT_TURN
    message = end.message.encode() if end.message is not None else {}
    if args.json and end.truncated and isinstance(streamed, io.StringIO) \
            and len(streamed.getvalue()) > len(str(message.get("content") or "")):
        message = {**message, "content": streamed.getvalue()}   # cut to fit max_message_size
    if args.json:
        # a message queued behind another turn has no id in the CHAT_TEXT reply: its TURN_START
        # carries it as stored
        user_message = started[0].user_message if started else reply.user_message
        _dump({"session_id": reply.session_id, "turn_id": turn_id, "user_message": user_message.encode(),
               "message": message, "tool_calls": message.get("tool_calls", []), "usage": end.usage,
               "finish_reason": end.finish_reason}, out)
    else:
        out.write("\n")
        out.flush()
    if end.finish_reason == "cancelled" and end.message is not None \
            and end.message.metadata.get("cancel_reason") == "shutdown":
        err.write("nplt-client: SHUTTING_DOWN: the server stopped during the answer (the partial answer was saved)\n")
        return EXIT_CONNECTION
    if end.finish_reason == "cancelled":
        err.write("nplt-client: CANCELLED: the turn was cancelled\n")
        return EXIT_TURN
    return EXIT_OK


EMPTY_MESSAGE = "the message is empty (give its text, or - and the text on stdin)"


def stdin_cap(limits: dict[str, Any]) -> int:
    """How many characters of stdin ``ask -`` takes at most (more is a usage error, exit 2):
    ``STDIN_READ_FACTOR`` x the server's ``max_text_chars``."""
    chars = limits.get("max_text_chars")
    if not isinstance(chars, int) or isinstance(chars, bool) or chars < 1:
        chars = STDIN_DEFAULT_TEXT_CHARS
    return STDIN_READ_FACTOR * chars


def check_message(text: str, limits: dict[str, Any]) -> None:
    """The refusal the server would give ``text`` for its size, given here before anything is made
    or changed: over ``max_text_chars`` characters (INVALID_MESSAGE, the server's own words), or a
    request over ``max_message_size`` bytes (MESSAGE_TOO_LARGE)."""
    cap = limits.get("max_text_chars")
    if isinstance(cap, int) and not isinstance(cap, bool) and len(text) > cap:
        raise ClientError(ErrorCode.INVALID_MESSAGE,
                          f"field 'text': expected at most {cap} characters, got {len(text)}")
    size_cap = limits.get("max_message_size")
    if isinstance(size_cap, int) and not isinstance(size_cap, bool):
        size = len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) + REQUEST_ENVELOPE_BYTES
        if size > size_cap:
            raise ClientError(ErrorCode.MESSAGE_TOO_LARGE,
                              f"the message would be a request of about {size} bytes, over the server's "
                              f"max_message_size ({size_cap} bytes)")


def _check_prompt_argument(text: str | None, what: str) -> None:
    """A blank system prompt (spaces only) would replace the server's with nothing: a usage error
    ("" is the reset, and stays allowed)."""
    if text and not text.strip():
        raise UsageError(f"{what} is blank: give the prompt's text, or '' to reset it to the server's")


class AskSetup:
    """What ``ask`` changed before its message (a session made or reused for ``--new``, the model,
    the system prompt), so that a message the server refuses leaves things as they were
    (``undo``): a session this command created is purged (it is empty: the message was refused);
    one it reused (the user's empty "New chat") gets its model back and no prompt of its own; an
    existing session gets its model and system prompt back. A model a session had none of its own
    (the server's default) is switched back to the default's name, as MODEL_SWITCH cannot unset it."""

    def __init__(self, client: Client, default_model: str | None) -> None:
        self.client = client
        self.default_model = default_model
        self.session_id: str | None = None
        self.created = False           # the session was created by this command (purged on undo)
        self.prompt: tuple[str | None] | None = None   # (the old prompt,) once this command changed it
        self.model: tuple[str | None] | None = None    # (the old model,) once this command switched it

    async def undo(self, err: TextIO) -> None:
        if self.session_id is None:
            return
        try:
            if self.created:
                await self.client.session_purge(self.session_id)
                return
            if self.model is not None:
                old = self.model[0] or self.default_model
                if old:
                    await self.client.model_switch(old, session_id=self.session_id)
            if self.prompt is not None:
                await self.client.session_prompt(self.prompt[0] or "", session_id=self.session_id)
        except ClientError as exc:
            err.write(f"nplt-client: the session {self.session_id} could not be put back as it was "
                      f"({exc.code}: {exc.message})\n")


async def _send(client: Client, args: argparse.Namespace, text: str, setup: AskSetup) -> tuple[Any, str]:
    """Set up the session (``--new``, ``--model``, ``--system``; each change noted in ``setup``) and
    send the message: the CHAT_TEXT reply and the turn id."""
    # --new, or a user without sessions: the message itself starts the session (server side), so
    # a message that fails leaves no empty session behind
    new = args.new or client.session_id is None
    if new and (args.model or args.system is not None):
        # the model / system prompt must be set before the message: the session is needed first
        created: set[str] = set()

        def note_created(event: Any) -> bool:
            if isinstance(event, SessionEvent) and event.kind == "created":
                created.add(event.session.session_id)
            return False               # (the event still goes to the queue)
        previous = client.taps.get(MsgType.SESSION_EVENT)
        client.taps[MsgType.SESSION_EVENT] = note_created
        try:      # the server sends "created" before this reply: it is noted by the time the reply is here
            made = await client.session_new(system_prompt=args.system or None)
        finally:
            if previous is None:
                client.taps.pop(MsgType.SESSION_EVENT, None)
            else:
                client.taps[MsgType.SESSION_EVENT] = previous
        setup.session_id = made.session.session_id
        setup.created = setup.session_id in created
        if not setup.created:          # the user's empty session, reused: SESSION_NEW replaced its
            setup.prompt = (None,)     # prompt, so it gets none of its own back
        old_model = made.session.model
        new = False
    else:
        old_model = None
        if not new and (args.model or args.system is not None):
            state = await client.session_prompt()      # (read: the model and prompt to restore)
            setup.session_id = state.session.session_id
            old_model = state.session.model
            if args.system is not None and (args.system or None) != state.system_prompt:
                setup.prompt = (state.system_prompt,)
                await client.session_prompt(args.system)        # "" resets it to the server's
    if args.model and args.model != old_model:
        setup.model = (old_model,)
        await client.model_switch(args.model)           # UNKNOWN_MODEL (exit 5) when not offered
    reply = await client.chat_send(text, new_session=new)
    return reply, reply.turn_id


def cancel_failed(exc: BaseException) -> str:
    """What stderr says when a stopped ``ask`` could not cancel its turn (``exc``: the cancel's error,
    or the timeout, whose own text is empty)."""
    reason = str(exc) or f"no reply within {CANCEL_WAIT_S:g} s"
    return f"the turn could not be cancelled ({reason}): the answer may still be generating on the server"


def _check_stdin() -> None:
    """UsageError when stdin is closed (``<&-``): checked before connecting."""
    stdin = sys.stdin
    if stdin is None or getattr(stdin, "closed", False):
        raise UsageError("stdin is closed: give the text as an argument, or pipe it in for -")


def stdin_too_long(cap: int, why: str) -> str:
    """The usage error for a stdin over ``cap`` characters (``why``: where the cap comes from)."""
    return f"stdin holds more than {cap} characters ({why}): nothing was sent"


async def _text_or_stdin(text: str, cap: int, why: str) -> str | None:
    """``text``, or for ``-`` what stdin holds (trailing newlines dropped; None when blank), read up
    to ``cap`` characters: more is a ``UsageError`` saying ``why`` (where the cap comes from),
    without reading the rest (a 300 MB stdin is not read into memory first). Text that is not UTF-8,
    or a stdin that is closed (``<&-``) or cannot be read, raises ``UsageError``."""
    if text != "-":
        return text
    _check_stdin()
    stdin = sys.stdin
    try:
        text = await asyncio.to_thread(stdin.read, cap + 1)
    except UnicodeDecodeError as exc:     # a stdin decoding strictly
        raise UsageError(f"stdin is not valid UTF-8 (byte 0x{exc.object[exc.start]:02x}): "
                         "the server takes UTF-8 text only") from None
    except (OSError, ValueError) as exc:  # an I/O error, a stream closed meanwhile
        raise UsageError(f"cannot read stdin: {getattr(exc, 'strerror', None) or exc}") from None
    if len(text) > cap:
        raise UsageError(stdin_too_long(cap, why))
    text = text.rstrip("\n")
    _check_utf8(text, "stdin")            # a stdin keeping undecodable bytes as surrogate escapes
    return text if text.strip() else None


class UsageError(Exception):
    """A usage error found while running a command (``nplt-client: USAGE: ...``, exit 2)."""


# arguments that are local paths, not text for the server: a file name need not be UTF-8
PATH_ARGUMENTS = frozenset({"paths", "output", "config", "tls_ca"})


def check_text_arguments(args: argparse.Namespace) -> None:
    """UsageError for an argument that is not valid UTF-8 (the shell passed bytes that Python kept
    as surrogate escapes): the server takes UTF-8 text only, so it is refused here, as a usage error."""
    for name, value in vars(args).items():
        if name in PATH_ARGUMENTS:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                _check_utf8(item, name.upper())


def _check_utf8(text: str, what: str) -> None:
    """UsageError unless ``text`` is valid UTF-8 (undecodable bytes come as surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = os.fsencode(text[exc.start])[0] if 0xDC80 <= ord(text[exc.start]) <= 0xDCFF else None
        raise UsageError(f"{what} is not valid UTF-8" + (f" (byte 0x{byte:02x})" if byte is not None else "")
                         + ": the server takes UTF-8 text only") from None


async def cmd_prompt(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Print, set (TEXT, or ``-``: stdin) or ``--clear`` a session's own system prompt."""
    text: str | None = None
    if args.clear:
        if args.text is not None:
            err.write("nplt-client: USAGE: give a prompt or --clear, not both\n")
            return EXIT_USAGE
        text = ""                            # "" resets it to the server's system prompt
    elif args.text is not None:
        if args.text != "-" and not args.text.strip():
            raise UsageError("the system prompt is blank: give its text, or --clear to reset it to the server's")
        text = await _text_or_stdin(args.text, STDIN_PROMPT_CHARS,
                                    f"{STDIN_READ_FACTOR} x the longest system prompt, {MAX_PROMPT_CHARS}")
        if text is None:
            err.write("nplt-client: USAGE: no system prompt on stdin (--clear resets it)\n")
            return EXIT_USAGE
    async with make_client(cfg) as client:
        _need_session(client, args.session)
        reply = await client.session_prompt(text, session_id=args.session)
    if args.json:
        _dump({"session_id": reply.session.session_id, "system_prompt": reply.system_prompt}, out)
    elif text is None:
        if reply.system_prompt is not None:
            out.write(reply.system_prompt + "\n")
        else:
            err.write(f"nplt-client: session {reply.session.session_id} uses the server's system prompt\n")
    elif reply.system_prompt is None:
        out.write(f"system prompt of {reply.session.session_id} reset to the server's\n")
    else:
        out.write(f"system prompt of {reply.session.session_id} set ({len(reply.system_prompt)} characters)\n")
    return EXIT_OK


async def _follow_turn(client: Client, turn_id: str, out: TextIO | None, err: TextIO | None,
                       started: list[TurnStart] | None = None) -> TurnEnd | TurnError:
    """Read events until the turn ends; stream deltas to ``out`` and tool activity to ``err``; the
    turn's TURN_START (its user message as stored) is appended to ``started``. A
    partial answer that ends otherwise than by TURN_END (TURN_ERROR, Ctrl+C, the server gone) gets
    its line ended here, so the error after it (and the shell prompt) starts on a line of its own."""
    shown = 0
    ended = False
    try:
        async for event in client.events():
            if isinstance(event, Disconnected):
                raise ClientError(errors.CONNECTION_LOST, event.error or "connection lost")
            if isinstance(event, ServerError) and event.error.fatal:
                stopped = event.error.code is ErrorCode.SHUTTING_DOWN
                raise ClientError(event.error.code, "the server stopped during the answer" if stopped
                                  else event.error.message)
            if not isinstance(event, TurnEvent) or event.turn_id != turn_id:
                continue
            match event:
                case AnswerDelta(text=text, offset=offset) if out is not None:
                    if offset + len(text) > shown:
                        out.write(text[max(0, shown - offset):])
                        out.flush()
                        shown = offset + len(text)
                case ToolCallEvent(call=call) if err is not None:
                    err.write(f"[tool {call.tool_name} {_arguments(call)}]\n")
                case TurnStart() if started is not None:
                    started.append(event)
                case TurnEnd():
                    ended = True                      # (the caller ends the line, or prints JSON)
                    return event
                case TurnError():
                    return event
        raise ClientError(errors.CONNECTION_LOST, "connection closed before the turn ended")
    finally:
        if shown and not ended and out is not None:
            out.write("\n")
            out.flush()


async def cmd_sessions(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """List the user's sessions, newest first (every page)."""
    sessions: list[SessionInfo] = []
    async with make_client(cfg) as client:
        before = None
        cap = client.hello.limits.get("max_page_size") if client.hello is not None else None
        size = min(args.page_size, cap) if isinstance(cap, int) and cap >= 1 else args.page_size
        while True:
            page = await client.session_list(before=before, limit=size, deleted=args.deleted)
            sessions.extend(page.sessions)
            before = page.next_before
            if not page.has_more or not before or (args.limit and len(sessions) >= args.limit):
                break
    if args.limit:
        sessions = sessions[:args.limit]
    if args.json:
        _dump({"sessions": [s.encode() for s in sessions]}, out)
        return EXIT_OK
    for s in sessions:
        out.write(f"{s.session_id}  {stamp(s.updated_at)}  {counted(s.message_count, 'message'):>14}  "
                  f"{s.title}\n")
    if not sessions:      # (stdout stays empty for scripts; a person learns why)
        err.write("nplt-client: the trash is empty\n" if args.deleted
                  else "nplt-client: no sessions yet (nplt-client ask starts one)\n")
    return EXIT_OK


def message_marks(meta: dict, cut: bool = False) -> list[str]:
    """What a stored message's metadata says about how it ended, for the text history: cancelled,
    stopped: the server shut down, interrupted, error CODE, partial, truncated, ... ``cut``: the
    server cut the message's text in this reply to fit its ``max_message_size`` (``truncated`` too)."""
    marks = []
    finish = meta.get("finish_reason")
    if finish == "cancelled" and meta.get("cancel_reason") in CANCEL_REASON_MARKS:
        marks.append(CANCEL_REASON_MARKS[meta["cancel_reason"]])   # not cancelled by anyone
    elif finish in ("cancelled", "interrupted", "length", "max_iterations", "context_budget"):
        marks.append(str(finish))
    error = meta.get("error")
    if error:
        code = error.get("code") if isinstance(error, dict) else error
        marks.append(f"error {code}")
    for flag in ("partial", "truncated"):
        if meta.get(flag) or (flag == "truncated" and cut):
            marks.append(flag)
    return marks


def cut_in_reply(message: ChatMessage) -> bool:
    """Whether the server cut a text of ``message`` (its content, a tool call's result) in the reply
    that brought it, to fit its ``max_message_size``: it ends with the server's cut mark (``CUT_MARK``)."""
    texts = [message.content] + [c.result for c in message.tool_calls if isinstance(c.result, str)]
    return any(CUT_MARK.search(t) for t in texts)


async def cmd_history(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Print one page of a session's history (newest page unless --before)."""
    async with make_client(cfg) as client:
        _need_session(client, args.session)
        _check_page_limit(client, args.limit)
        page = await client.history_page(session_id=args.session, before=args.before, limit=args.limit)
    if args.json:
        body = page.encode()
        # "truncated": true when the server cut texts of this page to fit max_message_size (as on the wire:
        # only then)
        _dump({k: body[k] for k in ("session_id", "messages", "has_more", "next_before", "total", "truncated")
               if k in body}, out)
        return EXIT_OK
    if page.truncated:
        err.write("nplt-client: the server cut the longest texts of this page to fit its max_message_size "
                  "(marked truncated); the stored messages are whole\n")
    for m in page.messages:
        marks = message_marks(m.metadata, page.truncated and cut_in_reply(m))
        out.write(f"[{m.id}] {m.role}  {stamp(m.timestamp, seconds=True)}"
                  + (f"  ({', '.join(marks)})" if marks else "") + "\n")
        for call in m.tool_calls:
            out.write(f"  tool {call.tool_name} {_arguments(call)} -> "
                      f"{call.status} ({call.duration:.3f}s)\n")
        failed = error_line(m.metadata) if m.role == "assistant" else None
        if failed is None:
            out.write((m.content or ("(no answer)" if m.role == "assistant" else "")) + "\n\n")
        else:   # what was streamed (if anything), then the error line the TUI shows
            out.write((m.content + "\n" if m.content else "") + failed + "\n\n")
    if page.has_more:
        out.write(f"(older messages: --before {page.next_before})\n")
    return EXIT_OK


async def cmd_search(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Search the user's messages (HISTORY_SEARCH): every session, or --session ID. A blank query is
    a usage error here, as a blank ``ask`` is (the server would refuse it)."""
    if not args.query.strip():
        raise UsageError("the query is empty: give the words to look for")
    async with make_client(cfg) as client:
        _check_page_limit(client, args.limit)
        found = await client.search(args.query, session_id=args.session, limit=args.limit)
    hits = found.hits
    if args.json:
        _dump({"hits": [h.encode() for h in hits], **({"truncated": True} if found.truncated else {})}, out)
        return EXIT_OK
    if found.truncated:
        err.write(f"nplt-client: only the best {counted(len(hits), 'hit')} fit in the server's reply "
                  "(some snippets may be cut)\n")
    for h in hits:
        out.write(f"{h.session_id}  [{h.message_id}] {h.role}  {stamp(h.timestamp)}  {h.title}\n"
                  f"  {' '.join(h.snippet.split())}\n")
    if not hits:
        err.write("nplt-client: no message matches\n")
    return EXIT_OK


async def cmd_rename(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Give a session a new title (SESSION_RENAME)."""
    async with make_client(cfg) as client:
        reply = await client.session_rename(args.title, session_id=args.session_id)
    if args.json:
        _dump({"session": reply.session.encode()}, out)
        return EXIT_OK
    out.write(f"renamed {reply.session.session_id}  {reply.session.title}\n")
    return EXIT_OK


async def cmd_clear(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Hide every message of a session (CLEAR_REQUEST); with --purge remove them from storage for good."""
    async with make_client(cfg) as client:
        _need_session(client, args.session)
        reply = await client.session_clear(session_id=args.session, purge=args.purge)
    if args.json:
        _dump({"session_id": reply.session.session_id, "cleared": reply.cleared, "purged": args.purge}, out)
        return EXIT_OK
    done = "cleared and purged" if args.purge else "cleared"
    out.write(f"{done} {counted(reply.cleared, 'message')} of {reply.session.session_id}\n")
    return EXIT_OK


async def cmd_export(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Export a session as Markdown or JSON to --output or stdout (``-o -``). ``--output`` is written
    atomically (``client.files``: a temporary file beside it, renamed over it), or through in place
    for a FIFO or a device; a folder means ``nplt-<session>.<ext>`` in it, and a path ending in a
    separator that is no folder is WRITE_FAILED, before the export is asked for."""
    output = None if args.output in (None, "-") else os.path.expanduser(args.output)
    async with make_client(cfg) as client:
        _need_session(client, args.session)
        dest = None
        if output is not None:
            dest = await _export_destination(output, args.output, files.export_name(
                args.session or client.session_id or "", args.format), out)
        reply = await client.export(args.format, session_id=args.session)
    content = reply.content
    if dest is None:
        out.write(content if content.endswith("\n") else content + "\n")
        out.flush()
        return EXIT_OK
    try:
        await files.write_export(dest, content.encode("utf-8"))
    except OSError as exc:
        raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {args.output}: {exc.strerror or exc}") from exc
    return EXIT_OK


async def _export_destination(path: str, given: str, name: str, out: TextIO) -> Path:
    """The file an export to ``path`` (``given``: as typed) is written to (``files.export_target``);
    one of this process's standard streams (``/dev/stdout``) must be open."""
    try:
        dest = await asyncio.to_thread(files.export_target, path, name)
        descriptor = await asyncio.to_thread(kbclient.own_descriptor, dest)
    except OSError as exc:
        raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {given}: {exc.strerror or exc}") from exc
    if descriptor in STANDARD_STREAMS:
        check_standard_stream(descriptor, out)
    return dest


async def cmd_clients(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Admins: ``clients list`` (the server's connections) and ``clients kill ID``."""
    async with make_client(cfg) as client:
        if args.action == "kill":
            reply = await client.client_kill(client_id=args.id)
            if args.json:
                _dump({"killed": list(reply.killed)}, out)
            else:
                out.write(f"killed {', '.join(map(str, reply.killed))}\n")
            return EXIT_OK
        listing = await client.client_list()
    clients = listing.clients
    if args.json:
        _dump({"clients": [c.encode() for c in clients], "truncated": listing.truncated}, out)
        return EXIT_OK
    if listing.truncated:
        err.write(f"nplt-client: only the {len(clients)} oldest connections fit in the server's reply\n")
    out.write(f"{'ID':>5}  {'PEER':<21} {'USER':<12} {'STATE':<11} {'PROTO':<5} {'AGE':>8} {'IDLE':>8} "
              f"{'IN':>9} {'OUT':>9}  SESSION\n")
    for c in clients:
        out.write(f"{c.id:>5}{'*' if c.me else ' '} {c.peer:<21} {c.user or '-':<12} {c.state:<11} {c.proto or '-':<5} "
                  f"{c.age_s:>7.1f}s {c.idle_s:>7.1f}s {c.buffered:>9} {c.output:>9}  {c.session or '-'}\n")
    return EXIT_OK


async def cmd_delete(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Move a session to the trash (restore brings it back, purge removes it for good)."""
    async with make_client(cfg) as client:
        reply = await client.session_delete(args.session_id)
    if args.json:
        _dump({"session_id": reply.session_id}, out)
        return EXIT_OK
    out.write(f"deleted {reply.session_id} (in the trash: nplt-client restore {reply.session_id})\n")
    return EXIT_OK


async def cmd_restore(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Bring a deleted session back out of the trash."""
    async with make_client(cfg) as client:
        reply = await client.session_restore(args.session_id)
    if args.json:
        _dump({"session": reply.session.encode()}, out)
        return EXIT_OK
    out.write(f"restored {reply.session.session_id}  {reply.session.title}\n")
    return EXIT_OK


async def cmd_purge(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """Remove a session for good (from the trash, or a live one)."""
    async with make_client(cfg) as client:
        reply = await client.session_purge(args.session_id)
    if args.json:
        _dump({"session_id": reply.session_id}, out)
        return EXIT_OK
    out.write(f"purged {reply.session_id}\n")
    return EXIT_OK


async def cmd_memory(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO) -> int:
    """``memory list [--json]``: the user's long-term memory; ``memory forget ID``: delete one item."""
    async with make_client(cfg) as client:
        if args.memory_command == "forget":
            reply = await client.memory_forget(args.item_id)
            if args.json:
                _dump({"item_id": reply.item_id}, out)
            else:
                out.write(f"forgot {reply.item_id}\n")
            return EXIT_OK
        listing = await client.memory_list()
    if args.json:
        _dump({"enabled": listing.enabled, "items": [i.encode() for i in listing.items],
               "truncated": listing.truncated}, out)
        return EXIT_OK
    if listing.truncated:
        err.write(f"nplt-client: only the {len(listing.items)} newest items fit in the server's reply\n")
    if not listing.enabled:
        out.write("long-term memory is turned off on this server\n")
    for i in listing.items:
        out.write(f"{i.id}  {i.kind:<10}  {stamp(i.created_at)}  "
                  f"session {i.session_id}  {i.text}\n")
    if listing.enabled and not listing.items:
        err.write("nplt-client: nothing remembered yet\n")
    return EXIT_OK


COMMANDS = {"ask": cmd_ask, "sessions": cmd_sessions, "prompt": cmd_prompt, "history": cmd_history,
            "search": cmd_search, "export": cmd_export, "rename": cmd_rename, "clear": cmd_clear,
            "delete": cmd_delete, "restore": cmd_restore, "purge": cmd_purge, "clients": cmd_clients,
            "kb": partial(cmd_kb, exit_code_for=exit_code_for), "memory": cmd_memory}


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("ask", help="send a message and stream the answer to stdout")
    p.add_argument("text", help="the message ('-': read it from stdin)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--session", metavar="ID", help="session to use (default: the most recently updated)")
    g.add_argument("--new", action="store_true", help="start a new session with this message")
    p.add_argument("--model", metavar="NAME",
                   help="switch the session's model to NAME (kept for its later turns)")
    p.add_argument("--system", metavar="TEXT",
                   help="set the session's own system prompt first (with --new: the new session's; '' resets)")
    p.add_argument("--json", action="store_true", help="print one JSON document at the end instead of streaming")
    p = sub.add_parser("prompt", help="print, set or clear a session's own system prompt")
    p.add_argument("text", nargs="?", metavar="TEXT", help="the new system prompt ('-': read it from stdin); "
                   "without TEXT the current one is printed")
    p.add_argument("--session", metavar="ID", help="session (default: the most recently updated)")
    p.add_argument("--clear", action="store_true", help="reset to the server's system prompt")
    p.add_argument("--json", action="store_true", help='print {"session_id", "system_prompt"}')
    p = sub.add_parser("sessions", help="list sessions, newest first")
    p.add_argument("--limit", type=_positive, default=0, metavar="N", help="at most N sessions (default: all)")
    p.add_argument("--page-size", type=_positive, default=100, help=argparse.SUPPRESS)
    p.add_argument("--deleted", action="store_true", help="list the trash (deleted sessions) instead")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("history", help="print one page of a session's messages")
    p.add_argument("--session", metavar="ID", help="session (default: the most recently updated)")
    p.add_argument("--before", type=_positive, metavar="CURSOR", help="message id cursor (next_before of a page)")
    p.add_argument("--limit", type=_positive, metavar="N", help="page size (server default 50)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("search", help="search your messages in every session (or one)")
    p.add_argument("query", metavar="QUERY", help="words to look for")
    p.add_argument("--session", metavar="ID", help="only this session (default: every session)")
    p.add_argument("--limit", type=_positive, metavar="N", help="at most N hits (server default 20)")
    p.add_argument("--json", action="store_true", help='print {"hits": [SearchHit, ...]}')
    p = sub.add_parser("export", help="export a session as Markdown or JSON")
    p.add_argument("--session", metavar="ID", help="session (default: the most recently updated)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write to FILE (replaced atomically when it exists; a FIFO or a device is written "
                        "through; a folder gets nplt-SESSION.md|json; '-' is stdout) instead of stdout")
    p = sub.add_parser("rename", help="give a session a new title")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("title", metavar="TITLE", help="1..200 characters, one line")
    p.add_argument("--json", action="store_true", help='print {"session": SessionInfo}')
    p = sub.add_parser("clear", help="hide every message of a session (--purge: remove them for good)")
    p.add_argument("--session", metavar="ID", help="session (default: the most recently updated)")
    p.add_argument("--purge", action="store_true",
                   help="also remove the hidden messages from the server's storage (cannot be undone)")
    p.add_argument("--json", action="store_true", help='print {"session_id", "cleared", "purged"}')
    p = sub.add_parser("clients", help="admins: list the server's connections, or kill one")
    acts = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = acts.add_parser("list", help="every connection: id (* = this one), peer, user, state, age, idle, bytes")
    a.add_argument("--json", action="store_true")
    a = acts.add_parser("kill", help="close connection ID (it is told CLIENT_KILLED)")
    a.add_argument("id", type=_positive, metavar="ID", help="the connection id from 'clients list'")
    a.add_argument("--json", action="store_true")
    p = sub.add_parser("delete", help="move a session to the trash")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("--json", action="store_true", help='print {"session_id"}')
    p = sub.add_parser("restore", help="bring a deleted session back out of the trash")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("--json", action="store_true", help='print {"session": SessionInfo}')
    p = sub.add_parser("purge", help="remove a session for good (it cannot be restored)")
    p.add_argument("session_id", metavar="ID")
    p.add_argument("--json", action="store_true", help='print {"session_id"}')
    add_kb_parser(sub)
    p = sub.add_parser("memory", help="list or forget what the assistant remembers about you")
    msub = p.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    q = msub.add_parser("list", help="list the remembered facts and preferences")
    q.add_argument("--json", action="store_true")
    q = msub.add_parser("forget", help="delete one remembered item")
    q.add_argument("item_id", metavar="ID", help="the item's id (from 'memory list')")
    q.add_argument("--json", action="store_true", help='print {"item_id"}')


def _positive(text: str) -> int:
    """A positive integer argument that the protocol can carry (at most ``MAX_INTEGER_ARGUMENT``,
    2^63-1): else a usage error, exit 2, before connecting."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    if value > MAX_INTEGER_ARGUMENT:
        raise argparse.ArgumentTypeError(f"expected a positive integer of at most {MAX_INTEGER_ARGUMENT} "
                                         f"(2^63-1), got {text!r}")
    return value


def _check_page_limit(client: Client, limit: int | None) -> None:
    """``--limit`` over the server's ``max_page_size`` (HELLO ``limits``, when it gives one): a usage
    error, exit 2, before the request (the server would refuse it INVALID_MESSAGE)."""
    cap = client.hello.limits.get("max_page_size") if client.hello is not None else None
    if limit is not None and isinstance(cap, int) and not isinstance(cap, bool) and limit > cap:
        raise UsageError(f"--limit {limit} is over the server's max_page_size ({cap})")


async def run_command(args: argparse.Namespace, cfg: ClientConfig, out: TextIO | None = None,
                      err: TextIO | None = None) -> int:
    """Run one subcommand, mapping every failure to its exit code and a stderr line. What it prints
    (mostly the server's text: answers, passages, titles, names, errors) goes through
    ``PrintableWriter``, so no control sequence in it reaches the terminal."""
    out = PrintableWriter(out or sys.stdout, "stdout")
    err = PrintableWriter(err or sys.stderr, "stderr", quiet=True)
    try:
        check_text_arguments(args)
        code = await COMMANDS[args.command](args, cfg, out, err)
        out.flush()          # a full disk shows here, not in the interpreter's final flush
        return code
    except WriteFailed as exc:   # stdout closed, full, or failing: a running ask turn was cancelled first
        err.write(f"nplt-client: WRITE_FAILED: {exc}\n")
        return EXIT_USAGE
    except UsageError as exc:
        err.write(f"nplt-client: USAGE: {exc}\n")
        return EXIT_USAGE
    except ClientError as exc:
        err.write(f"nplt-client: {exc.code}: {exc.message}\n")
        return exit_code_for(exc)
