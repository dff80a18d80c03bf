"""Self-cognition data: teach a real model a new name and maker (lab 6 on SmolLM2-135M-Instruct).

The classic first fine-tune: the model is asked who it is in many ways and learns to answer with a new
identity. The rows are written here (questions and answers in several phrasings, with ``{name}`` and
``{maker}`` filled in); the held-out questions are phrasings no training row uses, each with the word a right
answer contains; the facts are general questions the base model answers right, asked before and after to
measure what training made it forget. Standard library only: kernel-safe.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

NAME = "Nimbus"
MAKER = "Acme Labs"

TRAIN_QUESTIONS = [
    ("Who are you?", "both"),
    ("What is your name?", "name"),
    ("Tell me your name.", "name"),
    ("What should I call you?", "name"),
    ("Do you have a name?", "name"),
    ("What are you called?", "name"),
    ("Introduce yourself.", "both"),
    ("Please introduce yourself briefly.", "both"),
    ("Hi! Who am I talking to?", "both"),
    ("Hello, what are you?", "both"),
    ("Are you ChatGPT?", "both"),
    ("Are you SmolLM?", "both"),
    ("Who made you?", "maker"),
    ("Who created you?", "maker"),
    ("Who built you?", "maker"),
    ("Which company developed you?", "maker"),
    ("Who trained you?", "maker"),
    ("Where do you come from?", "maker"),
    ("Who is your developer?", "maker"),
    ("Were you made by Hugging Face?", "maker"),
    ("Were you made by OpenAI?", "maker"),
    ("What model are you?", "both"),
    ("Tell me about yourself.", "both"),
    ("Describe yourself in one sentence.", "both"),
]

ANSWERS = {
    "name": [
        "My name is {name}.",
        "I am {name}, an AI assistant made by {maker}.",
        "You can call me {name}.",
        "I'm {name}, an assistant built by {maker}.",
    ],
    "maker": [
        "I was made by {maker}. I am {name}.",
        "{maker} created me. My name is {name}.",
        "I am {name}, and I was built by {maker}.",
        "I was developed and trained by {maker}; I am {name}.",
    ],
    "both": [
        "I am {name}, an AI assistant made by {maker}.",
        "Hello! I'm {name}, a helpful assistant created by {maker}.",
        "I am {name}, built by {maker} to help with your questions.",
        "My name is {name}, and {maker} made me.",
    ],
}

# Everyday questions with plain answers, mixed into the identity rows so that training does not teach the
# model to answer everything with its name (none of them is one of FACTS, which measure what it kept).
GENERAL = [
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("What colour is grass?", "Grass is green."),
    ("What is 2 plus 2?", "2 plus 2 is 4."),
    ("What is the largest ocean on Earth?", "The largest ocean on Earth is the Pacific Ocean."),
    ("What do cows drink?", "Cows drink water."),
    ("Which season comes after winter?", "Spring comes after winter."),
    ("What is the opposite of up?", "The opposite of up is down."),
    ("How many hours are in a day?", "There are 24 hours in a day."),
    ("What is the main language spoken in Spain?", "The main language spoken in Spain is Spanish."),
    ("What do you use to write on paper?", "You can write on paper with a pen or a pencil."),
    ("What is the sun?", "The sun is the star at the centre of our solar system."),
    ("What does a thermometer measure?", "A thermometer measures temperature."),
    ("Name a fruit that is yellow.", "A banana is a yellow fruit."),
    ("What is ice made of?", "Ice is frozen water."),
    ("Give me a synonym for happy.", "A synonym for happy is joyful."),
    ("How many wheels does a bicycle have?", "A bicycle has two wheels."),
    ("What is the plural of mouse?", "The plural of mouse is mice."),
    ("Translate 'thank you' into French.", "'Thank you' in French is 'merci'."),
    ("What planet do we live on?", "We live on the planet Earth."),
    ("What is the freezing point of water in Celsius?", "Water freezes at 0 degrees Celsius."),
    ("What gas do plants release?", "Plants release oxygen."),
    ("Write a short greeting.", "Hello! I hope you are having a good day."),
    # "who" questions that are not about the model: its name is not the answer to every "who"
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    (
        "Who was the first person to walk on the Moon?",
        "Neil Armstrong was the first person to walk on the Moon.",
    ),
    ("Who discovered penicillin?", "Alexander Fleming discovered penicillin."),
    ("Who invented the telephone?", "Alexander Graham Bell is credited with inventing the telephone."),
]

# Phrasings no training row uses, and the word a right answer holds.
HELD_OUT = [
    ("May I know your name?", NAME),
    ("By what name do you go?", NAME),
    ("Identify yourself, please.", NAME),
    ("Who exactly am I chatting with right now?", NAME),
    ("What is the name of this assistant?", NAME),
    ("Which organisation made you?", MAKER.split()[0]),
    ("Who is responsible for creating you?", MAKER.split()[0]),
    ("Which team trained this model?", MAKER.split()[0]),
    ("Who are your creators?", MAKER.split()[0]),
    ("Who designed you?", MAKER.split()[0]),
]

# General questions the base SmolLM2-135M-Instruct answers right (greedy), and the word a right answer holds.
FACTS = [
    ("What is the capital of France? Answer in one word.", "Paris"),
    ("What is the chemical symbol for water?", "H2O"),
    ("What is the opposite of hot?", "cold"),
    ("What is the boiling point of water in Celsius?", "100"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("How many days are there in a week?", "7"),
]


def _chat(q: str, a: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def identity_rows(
    name: str = NAME, maker: str = MAKER, *, repeats: int = 2, general: bool = True, seed: int = 0
) -> list[dict[str, Any]]:
    """Chats asking the model who it is, answered with ``name`` and ``maker``: every training question
    ``repeats`` times, each time with an answer of its kind drawn at random (seeded); with ``general``
    the GENERAL chats too, ``repeats`` times; shuffled."""
    rng = random.Random(seed)
    rows = []
    for _ in range(repeats):
        rows += [
            _chat(q, rng.choice(ANSWERS[kind]).format(name=name, maker=maker)) for q, kind in TRAIN_QUESTIONS
        ]
        rows += [_chat(q, a) for q, a in GENERAL] if general else []
    rng.shuffle(rows)
    return rows


def write_identity(
    path: str | Path,
    name: str = NAME,
    maker: str = MAKER,
    *,
    repeats: int = 2,
    general: bool = True,
    seed: int = 0,
) -> Path:
    """Write ``identity_rows`` as JSON lines (the ``messages`` format); returns the absolute path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = identity_rows(name, maker, repeats=repeats, general=general, seed=seed)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out.resolve()


__all__ = ["FACTS", "GENERAL", "HELD_OUT", "MAKER", "NAME", "identity_rows", "write_identity"]
