// The chat widget's front end (nbtrain.ui.chat.ChatView, an anywidget ES module): the transcript, the
// text box and Send, tool calls waiting for Run / Skip. Linted with the lab extension (ESLint).
function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "nbtrain-chat";
  const log = document.createElement("div");
  log.className = "nbtrain-chat-log";
  const input = document.createElement("div");
  input.className = "nbtrain-chat-input";
  const ta = document.createElement("textarea");
  ta.rows = 1;
  ta.setAttribute("data-lm-suppress-shortcuts", "true");  // JupyterLab / Notebook 7 keys stay out
  const send = document.createElement("button");
  send.className = "nbtrain-chat-send";
  send.textContent = "Send";
  send.title = "Send (Enter)";
  const row = document.createElement("div");
  row.className = "nbtrain-chat-row";
  // A vision-language model's chat: a picture goes with the next message (the kernel checks its size).
  const file = document.createElement("input");
  file.type = "file";
  file.accept = "image/*";
  file.style.display = "none";
  const attach = document.createElement("button");
  attach.className = "nbtrain-chat-attach";
  attach.textContent = "Image";
  attach.title = "Attach a picture to the next message";
  const chip = document.createElement("span");
  chip.className = "nbtrain-chat-chip";
  const thumb = document.createElement("img");
  const drop = document.createElement("button");
  drop.className = "nbtrain-chat-drop";
  drop.textContent = "×";
  drop.title = "Remove the picture";
  chip.append(thumb, drop);
  attach.addEventListener("click", () => file.click());
  file.addEventListener("change", () => {
    const f = file.files && file.files[0];
    if (!f) return;
    const reader = new FileReader();
    reader.onload = () => { model.set("attached", String(reader.result)); model.save_changes(); };
    reader.readAsDataURL(f);
    file.value = "";
  });
  drop.addEventListener("click", () => { model.set("attached", ""); model.save_changes(); });
  row.append(attach, chip, file, ta, send);
  const hint = document.createElement("div");
  hint.className = "nbtrain-chat-hint";
  hint.textContent = "Enter sends \u00b7 Shift+Enter adds a line";
  input.append(row, hint);
  root.append(log, input);
  el.append(root);

  const grow = () => {
    ta.style.height = "auto";
    ta.style.height = Math.min(ta.scrollHeight + 2, 180) + "px";
  };
  const sync = () => {
    if (ta.value !== model.get("value")) { ta.value = model.get("value"); grow(); }
    ta.placeholder = model.get("placeholder");
    root.classList.toggle("nbtrain-chat-busy", model.get("busy"));
    send.disabled = !model.get("can_send");
    attach.style.display = model.get("images") ? "" : "none";
    const pic = model.get("attached");
    chip.style.display = pic ? "" : "none";
    if (pic && thumb.src !== pic) thumb.src = pic;
  };
  // The text goes with the message (the box's value may still be on its way to the kernel); the kernel
  // answers "sent" when it took the message, and only then is the box emptied.
  const submit = () => {
    if (ta.value.trim()) model.send({ type: "submit", text: ta.value, image: model.get("attached") });
    ta.focus();
  };
  model.on("msg:custom", (msg) => {
    if (msg && msg.type === "sent" && ta.value === msg.text) { ta.value = ""; typed(); }
  });
  send.addEventListener("click", submit);
  const typed = () => { model.set("value", ta.value); model.save_changes(); grow(); };
  ta.addEventListener("input", typed);
  ta.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || e.isComposing) return;
    e.stopPropagation();  // not the notebook's: Shift+Enter must not run the cell
    e.preventDefault();
    if (e.shiftKey) {  // a new line, put in here: JupyterLab cancels the browser's own (insertLineBreak)
      ta.setRangeText("\n", ta.selectionStart, ta.selectionEnd, "end");
      typed();
    } else {
      submit();
    }
  });

  const div = (cls, text) => {
    const d = document.createElement("div");
    d.className = cls;
    if (text !== undefined) d.textContent = text;
    return d;
  };
  // A tool call in a reply: the call as a block, Run / Skip while it waits for the user, then its result.
  const CALL_STATES = { asking: "run it?", running: "running…", done: "returned", error: "failed",
    skipped: "skipped" };
  const callBlock = (c) => {
    const box = div(`nbtrain-chat-call nbtrain-chat-call-${c.state}`);
    const head = div("nbtrain-chat-call-head");
    head.append(div("nbtrain-chat-call-tag", "tool"), div("nbtrain-chat-call-sig", c.shown),
      div("nbtrain-chat-call-state", CALL_STATES[c.state] || c.state));
    box.append(head);
    if (c.state === "asking") {
      const ask = div("nbtrain-chat-call-ask", "Run this function in your kernel?");
      const answer = (run, label, cls) => {
        const b = document.createElement("button");
        b.className = cls;
        b.textContent = label;
        b.addEventListener("click", () => {
          model.send({ type: "tool", id: c.id, run });
          for (const x of ask.querySelectorAll("button")) x.disabled = true;
        });
        return b;
      };
      ask.append(answer(true, "Run", "nbtrain-chat-call-run"),
        answer(false, "Skip", "nbtrain-chat-call-skip"));
      box.append(ask);
    }
    if (c.result) {
      const pre = document.createElement("pre");
      pre.className = "nbtrain-chat-call-result";
      pre.textContent = c.result;
      box.append(pre);
    }
    return box;
  };
  // A reply that tried to be a call the server could not read: what the model wrote, and what is wrong.
  const malformedBlock = (st) => {
    const box = div("nbtrain-chat-call nbtrain-chat-call-error nbtrain-chat-call-malformed");
    const head = div("nbtrain-chat-call-head");
    head.append(div("nbtrain-chat-call-tag", "tool"), div("nbtrain-chat-call-sig", st.text.trim()),
      div("nbtrain-chat-call-state", "malformed call"));
    box.append(head);
    const why = document.createElement("pre");
    why.className = "nbtrain-chat-call-result";
    why.textContent = `${st.error}; nothing was run`;
    box.append(why);
    return box;
  };
  const draw = () => {
    const stick = log.scrollHeight - log.scrollTop - log.clientHeight < 48;
    const turns = model.get("turns").slice();
    const live = model.get("live");
    if (live) turns.push(live);
    const kinds = model.get("kinds");
    const parts = [];
    if (!turns.length) parts.push(div("nbtrain-chat-empty", model.get("empty_text")));
    for (const t of turns) {
      const you = div("nbtrain-chat-msg nbtrain-chat-user");
      you.append(div("nbtrain-chat-who", "you"));
      for (const src of t.images || []) {
        const img = document.createElement("img");
        img.className = "nbtrain-chat-image";
        img.src = src;
        img.alt = "your picture";
        you.append(img);
      }
      you.append(div("nbtrain-chat-text", t.user));
      parts.push(you);
      const row = div("nbtrain-chat-replies");
      row.style.gridTemplateColumns = `repeat(${kinds.length}, minmax(0, 1fr))`;
      for (const [kind, label, title] of kinds) {
        const text = (t.replies || {})[kind];
        const waiting = (t.pending || []).includes(kind);
        if (text === undefined && !waiting) continue;
        const msg = div(`nbtrain-chat-msg nbtrain-chat-${kind}`);
        const who = div("nbtrain-chat-who", label);
        who.title = title;
        msg.append(who);
        const steps = (t.steps || {})[kind];
        if (steps && steps.length) {  // a chat with tools: text and calls in the order they came
          for (const st of steps) {
            if (st.type === "call") msg.append(callBlock(st));
            else if (st.type === "malformed") msg.append(malformedBlock(st));
            else if (st.text.trim()) msg.append(div("nbtrain-chat-text", st.text.replace(/^\s+/, "")));
          }
        } else {
          msg.append(div("nbtrain-chat-text", (text || "").replace(/^\s+/, "")));
        }
        if (waiting) msg.append(div("nbtrain-chat-typing", "\u25cf\u25cf\u25cf"));
        row.append(msg);
      }
      if (row.children.length) parts.push(row);
      if (t.note) parts.push(div("nbtrain-chat-note", t.note));
    }
    log.replaceChildren(...parts);
    if (stick) log.scrollTop = log.scrollHeight;
  };
  model.on("change:turns", draw);
  model.on("change:live", draw);
  model.on("change:kinds", draw);
  model.on("change:value", sync);
  model.on("change:placeholder", sync);
  model.on("change:busy", sync);
  model.on("change:can_send", sync);
  model.on("change:images", sync);
  model.on("change:attached", sync);
  sync();
  draw();
  requestAnimationFrame(() => { log.scrollTop = log.scrollHeight; });
}
export default { render };
