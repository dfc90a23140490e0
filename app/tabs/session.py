"""The Session tab: save the page as a session file, or restore one (:mod:`app.session_protocol` says what each
tab saves; :mod:`app.layout` wires the buttons)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


@dataclass(frozen=True)
class SessionUI:
    """The tab's components, by name."""

    save: gr.Button
    file: gr.File  # the saved session, to download
    upload: gr.File  # a session to restore
    status: gr.Markdown


def build() -> SessionUI:
    gr.Markdown(
        "A session file records the checkpoint, the image (by SHA-256), the playground head and each "
        "tab's settings. Restore it here, or export the same figures headless with "
        "`python -m ssog_core figures --session FILE`."
    )
    with gr.Row():
        save = gr.Button("Save session", elem_id="ses-save")
        file = gr.File(label="session.json", interactive=False, elem_id="ses-file")
        upload = gr.File(label="Restore a session (.json)", file_types=[".json"], elem_id="ses-upload")
    status = gr.Markdown(elem_id="ses-status")
    return SessionUI(save=save, file=file, upload=upload, status=status)
