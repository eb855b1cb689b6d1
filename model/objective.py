"""The COCO-LM pretraining objective: one module that receives the auxiliary model and the main encoder.

Per batch (docs/method.md sections 3-4): the auxiliary's train-mode pass gives L_aux_MLM; a dropout-free,
no-grad pass samples replacements at the masked positions M (x_mlm); the main encoder reads x_mlm
and is trained by the copy loss on every real position, the LM loss at M through the copy mixture,
and SCL between x_mlm and the crop view. Variants switch parts off through `ObjectiveConfig`.

M arrives as flat indices (`to_device`), optionally padded to a fixed count (`pad_masked_index`, with
`masked_valid` marking the real slots): then every batch gives the step the same shapes, and the
whole step compiles as one graph (`model.step.compile_step`). Padded slots are left out of every loss
and signal, so both forms give the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn

from . import losses
from .config import ModelConfig, ObjectiveConfig, SpecialTokens
from .corruption import (bert_mask_inputs, electra_generator_inputs, prediction_slots,
                         random_replacements, sample_replacements)
from .encoder import Encoder
from .heads import CLMHead, CopyHead, ElectraDiscriminatorHead, MLMHead, SCLHead


class AuxiliaryModel(nn.Module):
    """The shallow auxiliary ("generator"): an encoder sharing the main embeddings, plus its MLM head."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder
        self.mlm_head = MLMHead(encoder.cfg.hidden_size, encoder.embeddings.tokens, encoder.cfg.layer_norm_eps)

    def forward(
        self, masked_ids: torch.Tensor, attention_mask: torch.Tensor, index: torch.Tensor, all_real: bool = False
    ) -> torch.Tensor:
        """MLM logits at the masked positions only, given as `masked_index(mask_positions)`: (N, V)."""
        h = self.encoder(masked_ids, attention_mask, all_real)  # (B, T, H_aux)
        return self.mlm_head(take(h, index))


def dropout_active(encoder: Encoder) -> bool:
    """Whether a pass of `encoder` in training mode differs from one in eval mode (dropout is its only
    train-mode behaviour)."""
    return encoder.cfg.dropout > 0 or encoder.cfg.attention_dropout > 0


def masked_index(mask: torch.Tensor) -> torch.Tensor:
    """Flat indices of the True entries of a (B, T) mask, in the row-major order boolean indexing uses. (N,)

    Selecting with a boolean mask makes the host wait for the device (the result's size is data),
    and a step selects the masked positions a dozen times. So the index is computed once, on the
    host before the batch moves (`to_device`), and every selection after it is a gather (`take`).
    """
    return mask.flatten().nonzero().squeeze(1)


def unpadded(batch: dict[str, torch.Tensor]) -> bool:
    """Whether no row of the batch, in either view (the block and its crop), has padding.

    The stream packs every block full, so in pretraining this is True (the last block of a shard
    aside), and the encoders then attend with the relative bias alone, shared by the batch (see
    `model.attention.attention_bias`).
    """
    views = [batch[key].all() for key in ("attention_mask", "crop_attention_mask") if key in batch]
    return bool(torch.stack(views).all())


def step_inputs(batch: dict) -> tuple[torch.Tensor, bool]:
    """The two facts about a batch that a step needs on the host: M as flat indices (`masked_index`)
    and whether the batch has no padding (`unpadded`). Read from the batch when `to_device` put them
    there; otherwise computed here, which on a GPU makes the host wait for the device twice."""
    if "masked_index" in batch:
        return batch["masked_index"], batch["all_real"]
    return masked_index(batch["mask_positions"]), unpadded(batch)


def masked_valid(batch: dict) -> torch.Tensor | None:
    """(P,) bool, True on the real slots of a padded `masked_index` (`pad_masked_index`); None when
    the index is not padded, every slot real."""
    return batch.get("masked_valid")


def pad_masked_index(index: torch.Tensor, mask: torch.Tensor, rate: float) -> dict[str, torch.Tensor]:
    """The masked-position index (N,) padded to the fixed `prediction_slots(rate, B, T)`, so a step's
    shapes are the same for every batch: {"masked_index": (P,), "masked_valid": (P,) bool}.

    The real slots come first, in `masked_index` order, the padded ones after them (so a step's one
    draw of replacements from a generator gives the real slots the tokens an unpadded step draws; with
    more draws per step, or on another device, the tokens differ, but not their distribution).
    The padded slots point at an unmasked position (the first: [CLS] in a pretraining block), so
    writing its own token back there (`scatter`) leaves the batch as it was; the losses and
    accuracies leave them out (`losses.valid_mean`). The bound holds by construction for batches of
    `choose_mask_positions`; a batch masked otherwise that exceeds it is an error, never truncated.
    """
    slots, count = prediction_slots(rate, *mask.shape), index.numel()
    if count > slots:
        raise ValueError(f"{count} masked positions exceed the fixed {slots} slots of a {tuple(mask.shape)} batch at "
                         f"mask rate {rate} (model.corruption.prediction_slots); was it masked at another rate?")
    flat = mask.flatten()
    fill = int(torch.argmin(flat.to(torch.uint8)))  # the first unmasked position
    if count < slots and flat[fill]:
        raise ValueError("every position of the batch is masked: no position to point the padded slots at")
    return {"masked_index": torch.cat([index, index.new_full((slots - count,), fill)]),
            "masked_valid": torch.arange(slots) < count}


def to_device(batch: dict[str, torch.Tensor], device: torch.device, fixed_rate: float | None = None) -> dict:
    """A CPU batch moved to `device` for a training step, with `step_inputs` computed on the host
    first, where reading them costs nothing. The step then never waits for the device, so the host
    queues the next step's kernels while the GPU still runs this one's. On CUDA the copies come
    from pinned memory and do not block the host either.

    With `fixed_rate` (the data's mask rate; `train.fixed_shapes`) the index is padded to a fixed
    length (`pad_masked_index`), so every batch of one (B, T) gives the step the same shapes: the
    whole step compiles once and CUDA graphs can replay it."""
    index, all_real = step_inputs(batch)
    pinned = device.type == "cuda"
    tensors = {**batch, "masked_index": index}
    if fixed_rate is not None:
        tensors.update(pad_masked_index(index, batch["mask_positions"], fixed_rate))
    moved = {k: (v.pin_memory() if pinned else v).to(device, non_blocking=pinned) for k, v in tensors.items()
             if torch.is_tensor(v)}
    return {**moved, "all_real": all_real}


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The rows of x (B, T, ...) at flat indices from `masked_index`: (N, ...). Equals x[mask]."""
    return x.flatten(0, 1).index_select(0, index)


def scatter(x: torch.Tensor, index: torch.Tensor, values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """x (B, T) with `values` (N,) written at the flat `index`. The padded slots of a fixed-shape index
    (`valid` False) write back x's own token at the position they point at, so they change nothing."""
    flat = x.flatten()
    if valid is not None:
        values = torch.where(valid, values, flat.index_select(0, index))
    return flat.index_copy(0, index, values).view_as(x)


def _mean(values: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of a possibly empty selection (of its `valid` slots when given): NaN when empty, so an
    absent signal is never read as 0."""
    if valid is not None:
        return losses.masked_mean(values, valid)
    return values.float().mean() if values.numel() else values.new_tensor(float("nan"), dtype=torch.float32)


def _both(mask: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """`mask` restricted to the real slots of a padded index."""
    return mask if valid is None else mask & valid


@dataclass
class PretrainingOutput:
    """Total loss, every loss part (attached to the graph, so each one's gradient can be taken) and,
    computed without gradient, the signals the paper plots.

    Parts a variant does not compute are None; accuracies over an empty set are NaN.
    """

    loss: torch.Tensor
    aux_mlm_loss: torch.Tensor | None = None
    copy_loss: torch.Tensor | None = None
    lm_loss: torch.Tensor | None = None
    clm_loss: torch.Tensor | None = None
    scl_loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None  # roberta_mlm's plain MLM on the main encoder
    aux_mlm_accuracy: torch.Tensor | None = None
    copy_accuracy_replaced: torch.Tensor | None = None
    copy_accuracy_original: torch.Tensor | None = None
    lm_accuracy_replaced: torch.Tensor | None = None
    lm_accuracy_original: torch.Tensor | None = None
    mlm_accuracy: torch.Tensor | None = None
    scl_positive_cosine: torch.Tensor | None = None
    scl_negative_cosine: torch.Tensor | None = None
    cls_positive_cosine: torch.Tensor | None = None  # the same pairs on the raw [CLS] (objective.cls_cosines)
    cls_negative_cosine: torch.Tensor | None = None
    replaced_fraction: torch.Tensor | None = None  # replaced tokens / masked tokens

    def values(self) -> dict[str, torch.Tensor]:
        """Every computed value as a detached 0-d float tensor, still on the device (no sync)."""
        present = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return {name: value.detach().float().reshape(()) for name, value in present.items()}

    def metrics(self) -> dict[str, float]:
        """Every computed value as a float (one device sync), for logging; NaNs left out."""
        values = self.values()
        floats = torch.stack(list(values.values())).tolist()
        return {name: value for name, value in zip(values, floats) if value == value}


class PretrainingObjective(nn.Module):
    """COCO-LM (and every variant of docs/method.md section 5) as one module.

    `main` is the encoder users keep; `aux` is None for variants that need no auxiliary
    (random_replace, roberta_mlm). The heads on the main encoder live here.
    """

    def __init__(self, main: Encoder, aux: AuxiliaryModel | None, cfg: ObjectiveConfig,
                 special: SpecialTokens = SpecialTokens()):
        super().__init__()
        self.cfg = cfg
        self.special = special  # the tokenizer's ids: the [MASK] it reads, the regular ids it draws from
        self.main = main
        self.aux = aux
        hidden, tokens = main.cfg.hidden_size, main.embeddings.tokens
        if cfg.replacement == "none":
            self.mlm_head = MLMHead(hidden, tokens, main.cfg.layer_norm_eps)
        else:
            self.copy_head = ElectraDiscriminatorHead(hidden) if cfg.electra_head else CopyHead(hidden)
            self.clm_head = CLMHead(tokens) if cfg.use_lm else None
        self.scl_head = SCLHead(hidden, main.cfg.layer_norm_eps) if cfg.use_scl else None
        self._training_passes = 0  # counts training passes for `cls_cosines_every`
        if cfg.replacement == "auxiliary" and aux is None:
            raise ValueError("replacement='auxiliary' needs an auxiliary model")
        if aux is not None and cfg.freeze_aux:
            aux.requires_grad_(False)

    def _cls_cosines_due(self) -> bool:
        """Whether a variant without SCL encodes the crop view on this pass, for the [CLS] cosines only:
        every `cls_cosines_every`-th training pass, every pass outside training (held-out batches)."""
        if not self.training or self.cfg.cls_cosines_every == 1:
            return True
        self._training_passes += 1
        return self._training_passes % self.cfg.cls_cosines_every == 1

    @property
    def lm_head(self) -> nn.Module | None:
        """The main encoder's language-model head, kept with it for prompt-based fine-tuning: the CLM head,
        roberta_mlm's MLM head, or None for the variants that train none (rtd_only, scl_rtd, electra)."""
        return self.mlm_head if self.cfg.replacement == "none" else self.clm_head

    def forward(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> PretrainingOutput:
        if self.cfg.replacement == "none":
            return self._roberta_mlm(batch, generator)
        out = PretrainingOutput(loss=torch.zeros((), device=batch["input_ids"].device))
        index, all_real = step_inputs(batch)  # M as flat indices; no padding in either view
        corrupted = self._corrupt(batch, index, out, generator, all_real)  # x_mlm, (B, T)
        h = self.main(corrupted, batch["attention_mask"], all_real)  # (B, T, H)
        self._clm(batch, index, corrupted, h, out, all_real)
        if self.scl_head is not None:
            self._scl(batch, h, out, all_real)
        elif self.cfg.cls_cosines and self._cls_cosines_due():
            with torch.no_grad():
                h_crop = self.main(batch["crop_ids"], batch["crop_attention_mask"], all_real)
                out.cls_positive_cosine, out.cls_negative_cosine = losses.scl_cosines(h[:, 0].detach(), h_crop[:, 0])
        return out

    def _corrupt(
        self, batch: dict[str, torch.Tensor], index: torch.Tensor, out: PretrainingOutput,
        generator: torch.Generator | None, all_real: bool = False,
    ) -> torch.Tensor:
        """x_mlm: the masked positions filled with auxiliary samples (or uniform tokens); adds L_aux_MLM."""
        x_orig, valid = batch["input_ids"], masked_valid(batch)
        targets = take(x_orig, index)  # (N,)
        if self.cfg.replacement == "random":
            drawn = random_replacements(targets.numel(), self.main.cfg.vocab_size, x_orig.device, generator,
                                        self.special)
        else:
            drawn = self._aux_samples(batch, index, targets, out, generator, all_real)
        out.replaced_fraction = _mean(drawn != targets, valid)
        return scatter(x_orig, index, drawn, valid)

    def _aux_samples(
        self,
        batch: dict[str, torch.Tensor],
        index: torch.Tensor,
        targets: torch.Tensor,
        out: PretrainingOutput,
        generator: torch.Generator | None,
        all_real: bool = False,
    ) -> torch.Tensor:
        masked_ids, read_mask, valid = batch["masked_ids"], None, masked_valid(batch)
        if self.cfg.aux_unchanged_fraction:  # ELECTRA's generator sees some chosen positions unmasked
            shown = electra_generator_inputs(targets, self.cfg.aux_unchanged_fraction, generator,
                                             mask_id=self.special.mask)
            masked_ids = scatter(masked_ids, index, shown, valid)
            read_mask = shown == self.special.mask
        inputs = (masked_ids, batch["attention_mask"], index, all_real)
        train_logits = None
        if not self.cfg.freeze_aux:
            train_logits = self.aux(*inputs)  # (N, V), dropout on
            out.aux_mlm_loss = losses.mlm_loss(train_logits, targets, valid)
            out.loss = out.loss + self.cfg.aux_mlm_weight * out.aux_mlm_loss
        with torch.no_grad():
            # Without dropout the train pass already is the paper's dropout-free pass: its logits are the
            # eval pass's, so a second pass would only repeat them (study-cpu trains without dropout).
            if train_logits is None or (self.cfg.sample_in_eval and dropout_active(self.aux.encoder)):
                was_training = self.aux.training
                self.aux.eval()  # the paper's dropout-free sampling pass
                sample_logits = self.aux(*inputs)
                self.aux.train(was_training)
            else:
                sample_logits = train_logits.detach()
            # at the [MASK] inputs only, as roberta_mlm's: where the input shows the answer, copying it is no MLM
            correct = sample_logits.argmax(-1) == targets
            out.aux_mlm_accuracy = (_mean(correct, valid) if read_mask is None
                                    else losses.masked_mean(correct, _both(read_mask, valid)))
            return sample_replacements(sample_logits, generator)

    def _clm(
        self, batch: dict[str, torch.Tensor], index: torch.Tensor, corrupted: torch.Tensor, h: torch.Tensor,
        out: PretrainingOutput, all_real: bool = False,
    ) -> None:
        """Copy loss on every real position and the LM loss at M (or everywhere for all_token_lm)."""
        cfg, real = self.cfg, batch["attention_mask"]
        x_orig = batch["input_ids"]
        is_original = corrupted == x_orig  # a drawn token equal to the original counts as original
        copy_logits = self.copy_head(h)  # (B, T)
        clm = torch.zeros((), device=h.device)
        if cfg.use_copy_loss:
            out.copy_loss = losses.copy_loss(copy_logits, is_original, real)
            clm = clm + cfg.copy_weight * out.copy_loss
        with torch.no_grad():
            predicted_original = copy_logits > 0
            out.copy_accuracy_replaced = losses.masked_mean(~predicted_original, real & ~is_original)
            out.copy_accuracy_original = losses.masked_mean(predicted_original, real & is_original)
        if self.clm_head is not None:
            where, valid = self._lm_positions(batch, index, all_real)
            lm_logits = self.clm_head(take(h, where))  # (N, V): vocabulary projection only where the LM loss is
            args = (lm_logits, take(copy_logits, where), take(corrupted, where))
            targets = take(x_orig, where)
            out.lm_loss = losses.lm_loss(*args, targets, cfg.lm_copy_mixture, cfg.lm_stop_gradient, valid)
            clm = clm + cfg.lm_weight * out.lm_loss
            with torch.no_grad():
                correct = losses.lm_predictions(*args, cfg.lm_copy_mixture) == targets
                original_there = take(is_original, where)
                out.lm_accuracy_replaced = losses.masked_mean(correct, _both(~original_there, valid))
                out.lm_accuracy_original = losses.masked_mean(correct, _both(original_there, valid))
        out.clm_loss = clm
        out.loss = out.loss + clm

    def _lm_positions(
        self, batch: dict[str, torch.Tensor], index: torch.Tensor, all_real: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where the LM loss is taken, as flat indices, and which of them are real (None: all): M, or
        for all_token_lm every real position. In a padding-free batch those are all of them, without
        a host wait; with padding, a fixed-shape step takes every position and marks the real ones
        (a fixed shape), the other step selects them (the host waits on the count)."""
        valid = masked_valid(batch)
        if not self.cfg.lm_all_tokens:
            return index, valid
        real = batch["attention_mask"]
        every = torch.arange(real.numel(), device=real.device)
        if all_real:
            return every, None
        return (every, real.flatten()) if valid is not None else (masked_index(real), None)

    def _scl(
        self, batch: dict[str, torch.Tensor], h: torch.Tensor, out: PretrainingOutput, all_real: bool = False
    ) -> None:
        """SCL between the x_mlm view (already encoded) and the crop view; gradients through both."""
        h_crop = self.main(batch["crop_ids"], batch["crop_attention_mask"], all_real)  # (B, Tc, H)
        s_mlm, s_crop = self.scl_head(h[:, 0]), self.scl_head(h_crop[:, 0])  # (B, H) from [CLS]
        gather = losses.all_gather_with_grad if self.cfg.scl_gather and _distributed() else None
        out.scl_loss = losses.scl_loss(s_mlm, s_crop, self.cfg.scl_temperature, gather)
        out.loss = out.loss + self.cfg.scl_weight * out.scl_loss
        with torch.no_grad():
            out.scl_positive_cosine, out.scl_negative_cosine = losses.scl_cosines(s_mlm, s_crop)
            if self.cfg.cls_cosines:
                out.cls_positive_cosine, out.cls_negative_cosine = losses.scl_cosines(h[:, 0], h_crop[:, 0])

    def _roberta_mlm(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None) -> PretrainingOutput:
        """Baseline: RoBERTa's MLM. The main encoder reads the chosen positions as 80% [MASK], 10% random
        regular tokens, 10% unchanged, and is trained by plain MLM at all of them.

        Its accuracy is taken at the [MASK] inputs only. At the unchanged tenth the answer is in the
        input, and copying it alone lifts an accuracy over all chosen positions by up to 0.10: the
        unigram plateau would look left behind, and the auxiliary (which reads [MASK] everywhere)
        would look behind RoBERTa, with neither true."""
        index, all_real = step_inputs(batch)
        x_orig, valid = batch["input_ids"], masked_valid(batch)
        targets = take(x_orig, index)
        inputs = bert_mask_inputs(targets, self.main.cfg.vocab_size, generator, special=self.special)
        x_masked = scatter(x_orig, index, inputs, valid)
        h = self.main(x_masked, batch["attention_mask"], all_real)
        logits = self.mlm_head(take(h, index))  # (N, V)
        loss = losses.mlm_loss(logits, targets, valid)
        with torch.no_grad():
            accuracy = losses.masked_mean(logits.argmax(-1) == targets, _both(inputs == self.special.mask, valid))
        return PretrainingOutput(loss=loss, mlm_loss=loss.detach(), mlm_accuracy=accuracy)


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def build_pretraining_model(model_cfg: ModelConfig, objective_cfg: ObjectiveConfig,
                            special: SpecialTokens = SpecialTokens()) -> PretrainingObjective:
    """Main encoder, the auxiliary sharing its embeddings (when the objective samples from one), the heads;
    `special`: the ids of the tokenizer the batches were made with."""
    main = Encoder(model_cfg.main)
    aux = None
    if objective_cfg.replacement == "auxiliary":
        # A frozen (converged) auxiliary keeps embeddings of its own: shared ones would go on training.
        shared = None if objective_cfg.freeze_aux else main.embeddings
        aux = AuxiliaryModel(Encoder(model_cfg.aux, embeddings=shared))
    return PretrainingObjective(main, aux, objective_cfg, special)
