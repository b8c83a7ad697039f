"""THE contract between kdplug and its plugins.

Every component kdplug can use (teacher, student, layer extractor, projector, loss, task,
recipe) comes through one of the registration hooks below, first-party plugins included: they
are loaded through the ``kdplug`` entry-point group exactly like a third-party distribution.

A plugin is a module (or object) with functions marked ``@kdplug.hookimpl``::

    # my_projector/plugin.py ; pyproject: [project.entry-points.kdplug] my-proj = "my_projector.plugin"
    import kdplug

    @kdplug.hookimpl
    def kdplug_register_projectors(register):
        register("my-proj", MyProjector, description="cosine matching of the last layers")

Each registration hook is called once per plugin when the registry is first used. The
``register`` callback takes ``(name, factory, description="")``; a name may contain one integer
field such as ``"bert-{layers}"``, so ``bert-4`` calls the factory with ``layers=4``. Two plugins
registering the same name is an error that names both distributions.

Specs evolve only by adding arguments: an implementation may accept fewer arguments than the
spec lists (pluggy passes only those it names), so a plugin written today keeps working.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "kdplug"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@hookspec
def kdplug_register_teachers(register):
    """Register teacher factories.

    When: once, the first time a teacher is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(task, **options)``:
        task (kdplug.types.Task): the task the teacher will be used on (it sizes the head).
        options: keyword options from the run's ``teacher_options``. Every teacher factory
            accepts ``source``: a directory its ``save_pretrained`` wrote, which the engine
            passes to reload a fine-tuned teacher it stored.

    The factory returns a :class:`kdplug.types.Teacher`. Its model is put in eval mode and
    frozen by the engine; set ``finetuned=False`` when the engine must fine-tune it on the
    task first (the fine-tuned weights are stored and reused, keyed by a fingerprint).
    A factory that places the model itself (sharded over devices by a device map, some
    layers offloaded) sets ``placed_on`` to the device its inputs go to: the engine never
    moves that model.

    An optional ``shape(task, **options)`` attribute returns the
    :class:`kdplug.types.ModelShape` the teacher will have (its layers, widths and attention
    heads), read without loading weights (a config, in milliseconds), or None where it cannot
    tell: the run's projector options are then checked against it before the teacher is
    loaded or fine-tuned.
    """


@hookspec
def kdplug_register_students(register):
    """Register student factories.

    When: once, the first time a student is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(task, teacher, **options)``:
        task (kdplug.types.Task): the task (output width: ``kdplug.types.num_outputs(task)``).
        teacher (kdplug.types.Teacher): the fine-tuned teacher, e.g. to copy its first k
            layers (PKD's initialisation) or reuse its tokenizer and word embeddings.
        options: keyword options from the run's ``student_options``.

    The factory returns an ``nn.Module`` following :class:`kdplug.types.Student`: forward takes
    ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when it uses them) and returns an
    object with ``.logits`` ``(batch, C)``; some registered layer extractor must support it.
    An optional ``tokenizer`` attribute replaces the teacher's tokenizer for this student.

    An optional ``shape(task, teacher_shape, **options)`` attribute returns the
    :class:`kdplug.types.ModelShape` the student will have, given the teacher's, without
    building it (None where it cannot tell); it may raise a UsageError for options the
    teacher's shape rules out (``bert-9`` under a 4-layer teacher).
    """


@hookspec
def kdplug_register_layer_extractors(register):
    """Register layer extractors: how to read one vector per layer out of a model.

    When: once, the first time a model's layers are needed; the engine then asks each
    registered extractor, in registration order, ``supports(model)`` and uses the first that
    says yes.

    Parameters:
        register: ``register(name, extractor, description="")``; ``extractor`` is an object
            following :class:`kdplug.types.LayerExtractor` (not a factory).

    Nothing is returned by the hook; the registered extractor provides:
        supports(model) -> bool
        layer_specs(model) -> list[LayerSpec]: index, width and kind of every layer, layer 0
            being the embedding output where the model has one (kind ``"embedding"``).
        __call__(model, outputs) -> list[Tensor]: one ``(batch, width)`` tensor per spec, from
            the model's forward ``outputs`` (e.g. the [CLS] state of every Transformer layer).
    and, optionally, for Transformers whose per-token signals token-level methods distil:
        token_spec(model) -> TokenSpec | None: blocks, width and attention heads (None: none).
        forward_with_tokens(model, forward, mask) -> (outputs, TokenSignals): runs ``forward()``
            and returns its outputs with every hidden state and each block's Q, K and V.
    """


@hookspec
def kdplug_register_projectors(register):
    """Register projector factories (intermediate-layer distillation methods).

    When: once, the first time a projector is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(request, **options)``:
        request (kdplug.types.ProjectionRequest): the matchable teacher and student layers
            (specs), the output width and whether the task is a regression.
        options: keyword options from the run's ``projector_options`` (e.g. a layer map, an
            attention temperature).

    The factory returns an ``nn.Module`` following :class:`kdplug.types.Projector`. Its
    parameters are trained with the student's (one optimizer, one checkpoint). Its forward
    takes a :class:`kdplug.types.DistillInputs` and returns :class:`kdplug.types.ProjectedPairs`
    (or None for logit-only methods such as ``rkd``); the loss named by its ``ild_loss``
    attribute compares the pairs. Logit-only methods (``nkd``, ``rkd``) are projectors too.
    A projector that says ``needs_tokens = True`` (``tinybert``, ``minilm-v2``) also receives
    both models' :class:`kdplug.types.TokenSignals` (the engine runs the teacher on every batch)
    and may return each example's loss terms itself (``ProjectedPairs.terms``, ``ild_loss = None``).
    Where the teacher and student factories declare their shapes, the engine builds the
    projector once before the teacher is loaded, on the CPU, from the request those shapes give,
    and drops it: a constructor that raises UsageError for options the models rule out (a layer
    map, a head count) stops the run then. Keep the constructor cheap and free of side effects.
    """


@hookspec
def kdplug_register_losses(register):
    """Register loss factories.

    When: once, the first time a loss is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(**options)`` (e.g. ``temperature`` for ``kd``) and
    returns a callable ``loss(student, target, weights=None) -> scalar Tensor``:
        - pair losses (``mse``, ``normalized-mse``, ``kl``): ``student`` and ``target`` are
          ``(batch, P, D)``; the loss is summed over the P pairs and averaged over the batch;
          ``weights`` ``(batch, P)`` scales each pair's per-example term;
        - logit losses: ``ce`` takes logits ``(batch, C)`` and integer labels ``(batch,)``;
          ``kd`` takes student and teacher logits ``(batch, C)`` and returns
          τ²·KL(σ(t/τ) ‖ σ(s/τ)) with ``batchmean`` reduction.
    """


@hookspec
def kdplug_register_tasks(register):
    """Register task factories (a data set plus its metric).

    When: once, the first time a task is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(data_dir=None, **options)``:
        data_dir (str | None): a local directory with the task's files; None means the task's
            own source (e.g. the ``datasets`` hub copy of GLUE, or a generated demo set).
        options: keyword options from the run's ``task_options`` (e.g. ``max_train_examples``).

    The factory returns a :class:`kdplug.types.Task`. Reading problems (missing files,
    columns, malformed lines, labels outside the label set) raise
    :class:`kdplug.errors.DataError` naming the file, the line and what was expected.
    """


@hookspec
def kdplug_register_recipes(register):
    """Register recipe factories: the training schedule of a run (its stages).

    When: once, the first time a recipe is listed or created.

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(**options)`` with the run's ``recipe_options`` and
    returns an object with ``run(ctx) -> nn.Module``. ``ctx`` is a :class:`kdplug.api.RecipeContext`
    (the typed protocol; kdplug passes a view that refuses anything the protocol does not declare):
    it builds components (``ctx.new_student()``, ``ctx.new_projector(student)``,
    ``ctx.new_loss(name)``, ``ctx.new_kd_loss(temperature)``, ``ctx.new_teacher(name)``,
    ``ctx.has(kind, name)``), reads the run's
    settings (``ctx.settings.epochs``, read-only), resolves objective weights (``ctx.weights(projector,
    eta=.., lam=..)``), runs training stages (``ctx.train_stage(name, student, projector, weights=..,
    objective=..)``, which keeps the best dev checkpoint and records the stage), warms up teacher
    heads (``ctx.teacher_heads()``; also done by ``train_stage`` for a projector or objective whose
    ``needs_teacher_heads`` is True), gives the teacher's layers (``ctx.teacher_layer_specs()``),
    distils from another model, e.g. a trained teacher assistant (``ctx.with_teacher(teacher)``),
    records facts about a stage (``ctx.record(stage, **facts)``) and keeps what the recipe trains
    for reuse (``ctx.store_directory(kind, key)``, ``ctx.data_fingerprint()``).
    An ``objective`` gets a :class:`kdplug.api.StepState` per batch and returns its
    loss terms (key ``"loss"`` is optimised); with ``set_epoch(epoch, epochs)`` it can follow a
    schedule. A recipe whose stages use their own loss and never the run's projector says
    ``uses_projector = False``, and ``reads_teacher_layers = False`` when it reads only the
    teacher's logits (annealing, TAKD: the teacher cache then holds no layer vectors); the recipe
    of runs that name none says ``is_default = True``.
    ``run`` returns the final student, which the engine evaluates on the dev splits and exports.
    """


@hookspec
def kdplug_register_augmenters(register):
    """Register augmenter factories: how a transfer set is made from the training sentences.

    When: once, the first time an augmenter is listed or created (``--augment NAME``).

    Parameters:
        register: ``register(name, factory, description="")``.

    The factory is called as ``factory(teacher, **options)``:
        teacher (kdplug.types.Teacher): the run's teacher, e.g. for its tokenizer's mask token,
            its word embeddings or its masked-language-model head.
        options: keyword options from the run's ``augment_options`` (e.g. ``p_mask=0.2``).

    The factory returns a :class:`kdplug.types.Augmenter`: ``augmenter(text, rng)`` returns one
    augmented copy of a sentence, drawing all randomness from ``rng``; an optional
    ``prepare(sentences)`` is called first, once, with every training sentence (a read-only
    sequence, repeats included). Under a launch of several
    processes, an augmenter that also has ``prepare_share(sentences)`` (its work on one share of
    the distinct training sentences, JSON-serialisable) and ``prepare_join(shares)`` (the state
    ``prepare`` would leave, from every share's result in order) is prepared by every process on a
    share (`tang` tags its share of the sentences); without them each process calls ``prepare``.
    Each process then makes the copies of its share of the training examples, and rank 0 writes
    the set a single process writes. The engine calls it
    ``augment_factor`` times per training example (both sentences of a pair, as the augmenter's
    ``pair_schedule`` says), keeps each text once (dropping any equal to a dev or training
    sentence or to an earlier text, and copies of only stop words, punctuation and mask tokens),
    and stores the result by fingerprint for later runs. An augmenter's ``mask_token``
    attribute, if any, is read by each model's tokenizer as its own mask or unknown token, never
    as a token that begins, ends or pads a sequence (a tokenizer whose unknown token is one, as
    GPT-2's <|endoftext|>, reads the text "[MASK]").
    """
