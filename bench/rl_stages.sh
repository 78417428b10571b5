#!/usr/bin/env bash
# The RL learning run in stages that each fit a session (docs/experiments/2026-11-29-grpo-on-kept-prompts.md).
# Every stage skips what a previous call already finished, so a stage cut short is resumed by running it again.
#
#   bash bench/rl_stages.sh 1 [RUN]   # warm start; 512 training questions x 4 samples, in chunks; keep 0 < right < 4
#   bash bench/rl_stages.sh 2 [RUN]   # GRPO on the kept questions, validated every 5 steps (trainer.resume=auto)
#   bash bench/rl_stages.sh 2b [RUN]  # GRPO continued from stage 2's chosen step on the questions stage 1 never sampled
#   bash bench/rl_stages.sh 2c [RUN]  # GRPO continued from stage 2b's chosen step at half the lr, 200 validation q
#   bash bench/rl_stages.sh 3 [RUN]   # the step chosen on validation and the warm start on the 300 test questions
#                                     # (GRPO_DIR=$RUN/grpo_fresh NAME=rl_fresh for stage 2b's run,
#                                     #  GRPO_DIR=$RUN/grpo_2c NAME=rl_2c for stage 2c's)
#   bash bench/rl_stages.sh 4 [RUN]   # stage 3 on the other 300 test questions, MuSiQue and Bamboogle (same GRPO_DIR
#                                     # and NAME; SETS chooses)
#
# RUN defaults to runs/rl_kept. Needs the retriever at $RETRIEVER_URL (default http://127.0.0.1:8000/retrieve:
# `python -m retriever_server &`). PYTHON selects the interpreter. Stage 1 writes the kept question list to
# data/datasets/nq_hotpotqa_mini/rl_kept.parquet with its manifest (what later stages need, committed).
set -euo pipefail
STAGE=${1:?usage: rl_stages.sh 1|2|2b|2c|3|4 [RUN]}
RUN=${2:-runs/rl_kept}
PY=${PYTHON:-python}
URL=${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}
DATA=data/datasets/nq_hotpotqa_mini
KEPT=${KEPT:-$DATA/rl_kept.parquet}
# The standard budgets of docs/learning.md.
B=(retriever.url="$URL" max_turns=2 actor_rollout_ref.rollout.max_turn_tokens=64
   actor_rollout_ref.rollout.max_obs_tokens=384)
WARM=$RUN/sft384/global_step_12
mkdir -p "$RUN"

stamp() { echo "[$(date -u +%FT%TZ)] $*" | tee -a "$RUN/stages.log"; }

# The 12-step warm start (row 2 of docs/learning.md; seeded, so a later session on a new machine remakes the same).
warm_start() {
    if [[ ! -d $WARM/actor ]]; then
        stamp "stage $STAGE: warm start (row 2 of docs/learning.md)"
        "$PY" -m search_rl.main_sft trainer.default_local_dir="$RUN/sft384" trainer.total_training_steps=12 \
            trainer.save_freq=12 trainer.test_freq=0 trainer.resume=disable data.train_batch_size=8 "${B[@]}" \
            actor_rollout_ref.actor.optim.lr=1e-4 actor_rollout_ref.actor.optim.lr_warmup_steps=2
    fi
}

# Rows START to END (END empty: to the last) of parquet FILE in main_eval's seeded order (data.seed 0,
# PromptDataset.subset_indices), in file order, written to OUT: seeded_rows FILE START END OUT.
seeded_rows() {
    "$PY" -c "import sys, pandas as pd, torch
d = pd.read_parquet(sys.argv[1]); p = torch.randperm(len(d), generator=torch.Generator().manual_seed(0)).tolist()
end = int(sys.argv[3]) if sys.argv[3] else len(d)
d.iloc[sorted(p[int(sys.argv[2]):end])].to_parquet(sys.argv[4], index=False)" "$@"
}

# The warm start and model $2 (named $NAME) on the questions $3 describes, evaluated into $1/warm and $1/$NAME (each
# skipped when already there), then paired; further arguments are main_eval overrides choosing the questions.
score_pair() {
    local dir=$1 model=$2 what=$3
    shift 3
    for pair in "warm=$WARM/actor" "$NAME=$model/actor"; do
        name=${pair%%=*}
        if ! compgen -G "$dir/$name/*/metrics.json" >/dev/null; then
            stamp "stage $STAGE: $name on $what"
            "$PY" -m search_rl.main_eval model.path="${pair#*=}" "$@" "${B[@]}" output_dir="$dir/$name"
        fi
    done
    "$PY" -m search_rl.tools.compare_evals warm="$dir/warm" "$NAME=$dir/$NAME" | tee "$dir/compare_$NAME.md"
}

# GRPO as stages 2, 2b and 2c run it: from model $1 on questions $2 into $3, at most $4 generation batches a step;
# further arguments are overrides of these settings.
# Settings from the logs (docs/experiments): the 32 x 4 run collapsed entropy (0.53 -> 0.22) and pass@8
# (0.45 -> 0.35) while greedy EM stayed flat, and 3 of 4 groups carried no signal. So: prompts with signal
# (dynamic sampling on EM); 8 samples per prompt; clip-higher (DAPO's 0.28) against the collapse; full weights at
# rejection sampling's scale of update (the only path that moved the greedy answer); validated every 5 steps.
grpo() {
    "$PY" -m search_rl.main_ppo algorithm=grpo model.path="$1" "data.train_files=[$2]" \
        trainer.default_local_dir="$3" trainer.total_training_steps=${STEPS:-30} trainer.save_freq=5 \
        trainer.max_ckpt_to_keep=7 trainer.test_freq=5 trainer.val_before_train=false data.val_max_samples=100 \
        trainer.resume=auto 'trainer.logger=[console,jsonl]' trainer.torch_threads_per_worker=2 \
        data.train_batch_size=4 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
        "${B[@]}" actor_rollout_ref.actor.optim.lr=${LR:-1e-5} algorithm.clip_ratio_high=0.28 \
        reward.partial_credit=f1 reward.partial_credit_weight=0.5 \
        algorithm.filter_groups.enable=true algorithm.filter_groups.metric=em \
        algorithm.filter_groups.max_num_gen_batches="$4" "${@:5}"
}

warm_start
if [[ $STAGE == 1 ]]; then
    # The first QUESTIONS training questions of main_eval's seeded order (data.seed 0), in chunks of CHUNK, each
    # sampled 4 times at temperature 1 into its own folder: a session that ends mid-stage keeps its finished chunks.
    QUESTIONS=${QUESTIONS:-512}
    CHUNK=${CHUNK:-32}
    for ((start = 0; start < QUESTIONS; start += CHUNK)); do
        part=$RUN/samples/q$(printf %04d "$start")
        compgen -G "$part/*/metrics.json" >/dev/null && continue
        mkdir -p "$part"
        seeded_rows "$DATA/train.parquet" "$start" "$((start + CHUNK))" "$part/questions.parquet"
        stamp "stage 1: questions $start-$((start + CHUNK - 1)) x 4 samples at temperature 1"
        "$PY" -m search_rl.main_eval model.path="$WARM/actor" n_samples=4 "data.files=[$part/questions.parquet]" \
            "${B[@]}" output_dir="$part"
    done
    stamp "stage 1: keep the questions answered right in 1 to 3 of 4 samples"
    records=()
    for part in "$RUN"/samples/q*/; do
        compgen -G "$part*/metrics.json" >/dev/null && records+=(--records "$part")
    done
    "$PY" -m search_rl.tools.filter_prompts "${records[@]}" --questions "$DATA/train.parquet" --output "$KEPT"
    stamp "stage 1 done"
elif [[ $STAGE == 2 ]]; then
    # The kept questions of stage 1 (signal at k = 4), with dynamic sampling for the groups that still come out flat.
    stamp "stage 2: GRPO on $KEPT"
    grpo "$WARM" "$KEPT" "$RUN/grpo" 2
    stamp "stage 2 done"
elif [[ $STAGE == 2b ]]; then
    # Stage 2 fitted its pool: sampled EM on the 152 kept questions rose 0.22 -> 0.6 while validation stayed within
    # noise. So: go on from its chosen step on questions it never saw — the training questions after the first
    # QUESTIONS of stage 1's seeded order, unfiltered; dynamic sampling finds the groups with signal online (more
    # generation batches, since fresh questions carry signal less often than the kept ones). The step it starts from
    # is fixed on the first call (from.txt), so a resumed call continues the same run.
    OUT=$RUN/grpo_fresh
    FRESH=$RUN/fresh_questions.parquet
    mkdir -p "$OUT"
    [[ -s $OUT/from.txt ]] || "$PY" -m search_rl.tools.best_checkpoint "$RUN/grpo" | tail -1 >"$OUT/from.txt"
    FROM=$(cat "$OUT/from.txt")
    if [[ ! -s $FRESH ]]; then
        seeded_rows "$DATA/train.parquet" "${QUESTIONS:-512}" "" "$FRESH"
    fi
    stamp "stage 2b: GRPO from $FROM on $FRESH"
    grpo "$FROM" "$FRESH" "$OUT" 3
    stamp "stage 2b done"
elif [[ $STAGE == 2c ]]; then
    # Stage 2b peaked on validation at its step 5 and then stayed level while the entropy fell (0.31 -> 0.08-0.15):
    # at lr 1e-5 the policy narrows faster than it learns. So: go on from that step at half the learning rate, on
    # the same unfiltered questions in another order (trainer.seed 1: the first questions differ from those 2b's
    # five steps drew), validated on the 200 validation questions (100 gave a standard error of 0.043, wider than
    # the differences between steps), the starting point validated too (step 0) to compare the chosen step with.
    OUT=$RUN/grpo_2c
    mkdir -p "$OUT"
    [[ -s $OUT/from.txt ]] || "$PY" -m search_rl.tools.best_checkpoint "$RUN/grpo_fresh" | tail -1 >"$OUT/from.txt"
    FROM=$(cat "$OUT/from.txt")
    stamp "stage 2c: GRPO from $FROM on $RUN/fresh_questions.parquet, lr ${LR:-5e-6}"
    LR=${LR:-5e-6} grpo "$FROM" "$RUN/fresh_questions.parquet" "$OUT" 3 trainer.seed=1 data.val_max_samples=200 \
        trainer.val_before_train=true
    stamp "stage 2c done"
elif [[ $STAGE == 3 ]]; then
    GRPO_DIR=${GRPO_DIR:-$RUN/grpo}
    NAME=${NAME:-rl}
    BEST=$("$PY" -m search_rl.tools.best_checkpoint "$GRPO_DIR" | tail -1)
    stamp "stage 3: chosen on validation: $BEST"
    score_pair "$RUN/test300" "$BEST" "the 300 test questions" data.max_samples=300
    stamp "stage 3 done"
elif [[ $STAGE == 4 ]]; then
    # Stage 3's comparison on questions no stage has scored an RL model on: the other 300 test questions (the rows of
    # test.parquet that data.max_samples=300 with data.seed 0 leaves out), then the shipped datasets never trained on
    # (SETS: other300 musique bamboogle 2wikimultihopqa; MuSiQue's gold passages are in the corpus, Bamboogle's and
    # 2wiki's answers need not be). One evaluation per model and set, skipped when already there.
    GRPO_DIR=${GRPO_DIR:-$RUN/grpo}
    NAME=${NAME:-rl}
    BEST=$("$PY" -m search_rl.tools.best_checkpoint "$GRPO_DIR" | tail -1)
    stamp "stage 4: chosen on validation: $BEST"
    for set in ${SETS:-other300 musique bamboogle}; do
        mkdir -p "$RUN/$set"
        if [[ $set == other300 ]]; then
            questions=$RUN/$set/questions.parquet
            seeded_rows "$DATA/test.parquet" 300 "" "$questions"
        else
            questions=data/datasets/eval/${set}_test.parquet
        fi
        score_pair "$RUN/$set" "$BEST" "$questions" "data.files=[$questions]"
    done
    stamp "stage 4 done"
else
    echo "stage must be 1, 2, 2b, 2c, 3 or 4" >&2; exit 2
fi
