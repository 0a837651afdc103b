"""Every TUI action in one table: key bindings (with ids for the config keymap), palette entries and help rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from textual.binding import Binding


@dataclass(frozen=True, slots=True)
class ActionSpec:
    id: str          # binding id, the key of the config [keymap] table
    keys: str        # default keys, comma separated
    action: str      # App action name (action_<name>)
    title: str       # palette / footer title
    help: str        # one-line description
    show: bool = False   # shown in the footer
    priority: bool = False


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("app.help", "f1,question_mark", "help", "Help", "Show key bindings and usage", show=True),
    ActionSpec("app.quit", "ctrl+q", "quit", "Quit", "Leave the client", show=True),
    ActionSpec("chat.cancel", "escape", "cancel_turn", "Cancel answer", "Cancel the running answer", show=True),
    ActionSpec("chat.focus_input", "ctrl+l", "focus_input", "Focus input", "Move the focus to the message input"),
    ActionSpec("chat.older", "ctrl+t", "load_older", "Load older messages", "Load the previous page of history"),
    ActionSpec("session.new", "ctrl+n", "new_session", "New session", "Start a new session", show=True),
    ActionSpec("session.focus_list", "ctrl+g", "focus_sessions", "Sessions", "Move the focus to the sessions list"),
    ActionSpec("session.rename", "f2", "rename_session", "Rename session", "Rename the current session", show=True),
    ActionSpec("session.delete", "f8", "delete_session", "Delete session",
               "Move the current session to the trash (asks first; restorable until purged)"),
    ActionSpec("session.clear", "f9", "clear_session", "Clear session",
               "Hide every message of the current session, or hide and purge them (asks first)"),
    ActionSpec("session.trash", "f10", "trash", "Trash", "Deleted sessions: restore one, or purge it for good"),
    ActionSpec("session.prompt", "ctrl+o", "system_prompt", "System prompt",
               "Edit the current session's own system prompt (empty: the server's default)"),
    ActionSpec("chat.regenerate", "ctrl+r", "regenerate", "Regenerate answer",
               "Answer the last message again (the old answer is superseded)"),
    ActionSpec("chat.edit", "f5", "edit_message", "Edit and resend",
               "Edit the focused (or last) message you sent and resend it (what followed is superseded)"),
    ActionSpec("history.search", "ctrl+f", "search", "Search", "Search across sessions and jump to a message",
               show=True),
    ActionSpec("history.export", "ctrl+s", "export", "Export session", "Export the current session to a file"),
    ActionSpec("message.copy", "f3", "copy_message", "Copy message",
               "Copy the focused message (or the last answer) to the clipboard"),
    ActionSpec("message.copy_code", "f4", "copy_code", "Copy code block",
               "Copy the last code block of the focused message (or the last answer)"),
    ActionSpec("message.why", "f6", "why", "Why this answer",
               "Show what reached the model for the focused answer (or the last one)", priority=True),
    ActionSpec("memory.panel", "f7", "memory", "Long-term memory",
               "List what the assistant remembers about you, and forget items", priority=True),
    ActionSpec("kb.panel", "f12", "knowledge", "Knowledge base",
               "Your documents: list, upload, download, delete"),
    ActionSpec("kb.upload", "f11", "upload", "Upload to the knowledge base",
               "Upload a file (the path completes) with a progress bar", priority=True),
    ActionSpec("view.sidebar", "ctrl+b", "toggle_sidebar", "Toggle sidebar", "Show or hide the sessions sidebar"),
)

BY_ID = {a.id: a for a in ACTIONS}


def bindings() -> list[Binding]:
    """App BINDINGS built from the table (ids make them remappable with App.set_keymap)."""
    return [Binding(a.keys, a.action, a.title, show=a.show, id=a.id, priority=a.priority) for a in ACTIONS]


def effective_keys(keymap: Mapping[str, str]) -> dict[str, str]:
    """Binding id -> keys after applying the user's keymap."""
    return {a.id: keymap.get(a.id, a.keys) for a in ACTIONS}


def unknown_ids(keymap: Mapping[str, str]) -> list[str]:
    """Keymap entries that name no binding (reported to the user, not fatal)."""
    return sorted(k for k in keymap if k not in BY_ID)


def help_rows(keymap: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(binding id, keys, description) for the help screen, plus the fixed palette binding."""
    keys = effective_keys(keymap)
    rows = [(a.id, keys[a.id], a.help) for a in ACTIONS]
    rows.insert(1, ("app.palette", "ctrl+p", "Command palette: every action, models, themes"))
    return rows


def palette_entries() -> Iterable[ActionSpec]:
    return ACTIONS
