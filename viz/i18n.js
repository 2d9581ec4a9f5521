// English and 中文: every fixed label of the page, and the scheduler's reasons.
//
// The engine writes its reasons and its rejections in English. Known reason patterns are mapped here to
// Chinese templates (the numbers carried over); a reason no pattern knows is shown as the
// engine wrote it, so nothing is ever hidden by a missing translation.

const STRINGS = {
  en: {
    title: "minicb: continuous batching, live",
    subtitle: "Each row is a request; each cell an iteration of its engine, as wide as it took (on the iterations axis: one column each).",
    connecting: "connecting…", connected: "live", disconnected: "disconnected: reload to reconnect",
    askKey: "This minicb server needs a key (ask whoever runs it):", badKey: "wrong key",
    hidden: "(hidden: this view shows no texts)",
    replayMode: "replay", demoMode: "live demo", serveMode: "API server",
    pause: "Pause", resume: "Resume", step: "Step one iteration", speed: "Delay between rounds",
    xaxis: "x axis", iterations: "iterations", walltime: "wall time (s)",
    simtime: "simulated time (s)", simulatedBadge: "SIMULATED", simGpu: "simulated GPU",
    simModel: "model", simSwitched: "now simulating", simSpeed: "simulated s per s",
    window: "window", all: "all",
    workload: "Workload", preset: "arrivals", burst: "burst", poisson: "Poisson", off: "off",
    rate: "rate (req/s)", count: "burst size", lengths: "output lengths",
    short: "short", long: "long", mixed: "mixed", apply: "Apply",
    settings: "Engine settings (rebuilds both engines)",
    max_num_seqs: "max sequences", max_num_batched_tokens: "token budget",
    enable_chunked_prefill: "chunked prefill", num_kv_blocks: "KV pool (blocks)",
    enable_prefix_caching: "prefix caching",
    preemption_mode: "preemption", policy: "policy", rebuild: "Rebuild",
    pm_recompute: "recompute", pm_swap: "swap", pol_fcfs: "fcfs", pol_priority: "priority",
    static_order: "static batches", so_arrival: "in arrival order", so_length: "sorted by length",
    speculative: "speculative decoding", spec_off: "off", spec_ngram: "n-gram drafts", spec_early_exit: "early exit (self-speculation)",
    draftAt: "draft here", accepted: "guesses accepted", bonusToken: "the model's bonus token",
    prompt: "Your prompt", send: "Send", target: "to", both: "both engines",
    continuousOnly: "continuous only", maxTokens: "max tokens",
    promptPlaceholder: "Type a prompt and watch it join the batch",
    decisions: "Scheduler decisions of the last single step",
    noDecisions: "(no decisions: the batch just went on)",
    idleEngine: "(idle: nothing to run)",
    static: "static batching", continuous: "continuous batching", api: "API engine",
    toks: "output tok/s", occupancy: "slot occupancy", padding: "padding waste",
    ttft50: "TTFT p50", ttft99: "TTFT p99", queue: "queue", done: "finished",
    parallel: "tensor-parallel ranks · collectives",
    kvmap: "KV cache blocks", kvFree: "free", kvSwapped: "swapped to CPU", kvHost: "prefixes in host memory",
    kvUsed: "used", preemptedNow: "preempted",
    kvBlock: "block", kvShared: "shared", kvCached: "free, still cached (evictable)",
    kvCell: "cell", kvBlocks: "blocks", kvCellIs: "one cell =", rowsShown: "rows: the latest", rowsOf: "of",
    rowsSampled: "rows: 1 request in {every}, {shown} of {all}",
    rowsSampledNow: "rows: the batch now and 1 in {every} of the rest, {shown} of {all}",
    arrivalsSkipped: "arrivals skipped: {skipped} of {total}, for both engines while either held {limit} requests (both keep the same workload; the other's timeline has gaps)",
    kvReserved: "reserved, not written yet",
    occupancyChart: "Slot occupancy over time (useful rows / max sequences)",
    utilChart: "GPU utilisation per iteration (the step's work at the peaks / its time)",
    lanes: "Host and device, the latest iterations (schedule · process outputs | prepare inputs · forward + sample)",
    lanesIdle: "the device idle {idle} of these {n} iterations' time", lanesHost: "host", lanesDevice: "device",
    utilChartReal: "Utilisation per iteration, measured: the step's bytes and FLOPs at this machine's probed rates / its forward time",
    utilRates: "Probed on this machine: copy {bw} GB/s (read + write), matmul {fl} GFLOP/s.",
    utilAboveRoofline: "Above 100 %: faster than the probe's DRAM copy, so above the DRAM roofline: the weights fit in the CPU's caches, or other work slowed the probe at start-up. Drawn at 100 %; hover for the value.",
    bandwidthUtil: "memory bandwidth",
    flopUtil: "FLOPs",
    legend: "Legend",
    ph_waiting: "waiting", ph_prefill: "prefill chunk", ph_decode: "decode",
    ph_padding: "padding (static)", ph_preempted: "preempted", ph_swapped: "swapped out",
    scrub: "Scrub through the trace", play: "Play", stop: "Stop",
    req: "request", state: "state", text: "text so far", ttft: "TTFT", reasons: "reasons",
    promptLabel: "prompt", tokens: "tokens", arrivedAt: "arrived at iteration",
    left: "left at iteration", running: "in the batch", finished: "finished",
    dropped: "events dropped (tab too slow)", error: "error",
    round: "round", idle: "idle",
    lessonMenu: "lesson", lessonBack: "Back", lessonNext: "Next",
    lessonStart: "Press Next to run the lesson to its first narration point.",
    help: "Static batching waits for the whole batch to finish before admitting anyone; continuous batching admits new requests at every iteration.",
    definitions: "TTFT percentiles include the requests still waiting for their first token, counted at their wait so far: a lower bound, marked ≥. Padding waste: padding tokens / all tokens computed.",
  },
  zh: {
    title: "minicb：连续批处理实时演示",
    subtitle: "每一行是一个请求；每一格是该引擎的一次迭代，宽度是它所用的时间（横轴选迭代次数时：每次迭代一列）。",
    connecting: "连接中…", connected: "实时", disconnected: "已断开：请刷新页面重连",
    askKey: "此 minicb 服务器需要密钥（请向运行者索取）：", badKey: "密钥错误",
    hidden: "（已隐藏：此视图不显示文本）",
    replayMode: "回放", demoMode: "实时演示", serveMode: "API 服务",
    pause: "暂停", resume: "继续", step: "单步执行一次迭代", speed: "每轮间隔",
    xaxis: "横轴", iterations: "迭代次数", walltime: "墙钟时间（秒）",
    simtime: "模拟时间（秒）", simulatedBadge: "模拟运行", simGpu: "模拟的 GPU",
    simModel: "模型", simSwitched: "现在模拟的是", simSpeed: "每秒模拟秒数",
    window: "窗口", all: "全部",
    workload: "负载", preset: "到达方式", burst: "突发", poisson: "泊松", off: "关闭",
    rate: "速率（请求/秒）", count: "突发数量", lengths: "输出长度",
    short: "短", long: "长", mixed: "混合", apply: "应用",
    settings: "引擎设置（会重建两个引擎）",
    max_num_seqs: "最大序列数", max_num_batched_tokens: "token 预算",
    enable_chunked_prefill: "分段预填充", num_kv_blocks: "KV 池（块）",
    enable_prefix_caching: "前缀缓存",
    preemption_mode: "抢占方式", policy: "调度策略", rebuild: "重建",
    pm_recompute: "重算（recompute）", pm_swap: "换出（swap）", pol_fcfs: "先来先服务（fcfs）", pol_priority: "优先级（priority）",
    static_order: "静态批的组成", so_arrival: "按到达顺序", so_length: "按长度排序",
    speculative: "推测解码", spec_off: "关闭", spec_ngram: "n-gram 草稿", spec_early_exit: "提前退出（自推测）",
    draftAt: "此处的草稿", accepted: "个猜测被接受", bonusToken: "模型的奖励 token",
    prompt: "你的提示词", send: "发送", target: "发往", both: "两个引擎",
    continuousOnly: "仅连续批处理", maxTokens: "最大 token 数",
    promptPlaceholder: "输入提示词，看它加入批次",
    decisions: "上一次单步的调度决策",
    noDecisions: "（没有新决策：批次照常继续）",
    idleEngine: "（空闲：没有可运行的请求）",
    static: "静态批处理", continuous: "连续批处理", api: "API 引擎",
    toks: "输出 token/秒", occupancy: "槽位占用率", padding: "填充浪费",
    ttft50: "首 token 延迟 p50", ttft99: "首 token 延迟 p99", queue: "排队", done: "已完成",
    parallel: "张量并行进程数 · 通信耗时",
    kvmap: "KV 缓存块", kvFree: "空闲", kvSwapped: "已换出到 CPU", kvHost: "主机内存中的前缀块",
    kvUsed: "已用", preemptedNow: "被抢占",
    kvBlock: "块", kvShared: "共享", kvCached: "空闲，仍存有缓存前缀（可回收）",
    kvCell: "格", kvBlocks: "个块", kvCellIs: "一格 =", rowsShown: "行：最近的", rowsOf: "共",
    rowsSampled: "行：每 {every} 个请求取 1 个，{all} 个中的 {shown} 个",
    rowsSampledNow: "行：当前批次全部，其余每 {every} 个取 1 个，{all} 个中的 {shown} 个",
    arrivalsSkipped: "跳过的到达请求：{total} 个中的 {skipped} 个；任一引擎持有 {limit} 个请求时，两个引擎都跳过（两边负载相同，另一边的时间线因此出现空档）",
    kvReserved: "已预留，尚未写入",
    occupancyChart: "槽位占用率随时间变化（有效行 / 最大序列数）",
    utilChart: "每次迭代的 GPU 利用率（按峰值完成这一步所需时间 / 实际用时）",
    lanes: "主机与设备，最近的迭代（调度 · 处理输出 | 准备输入 · 前向 + 采样）",
    lanesIdle: "这 {n} 次迭代的时间里设备空闲 {idle}", lanesHost: "主机", lanesDevice: "设备",
    utilChartReal: "每次迭代的利用率（实测）：这一步的字节数和浮点运算量按本机探测速率所需的时间 / 前向实际用时",
    utilRates: "本机探测：拷贝带宽 {bw} GB/s（读 + 写），矩阵乘 {fl} GFLOP/s。",
    utilAboveRoofline: "超过 100 %：比探测时的内存拷贝还快，超出了内存带宽的屋顶线：要么权重能放进 CPU 缓存，要么启动探测时机器正忙、测低了。图上画在 100 %，悬停可看实际数值。",
    bandwidthUtil: "内存带宽",
    flopUtil: "算力",
    legend: "图例",
    ph_waiting: "等待", ph_prefill: "预填充段", ph_decode: "解码",
    ph_padding: "填充（静态）", ph_preempted: "被抢占", ph_swapped: "已换出",
    scrub: "拖动浏览记录", play: "播放", stop: "停止",
    req: "请求", state: "状态", text: "已生成文本", ttft: "首 token 延迟", reasons: "原因",
    promptLabel: "提示词", tokens: "token", arrivedAt: "到达于迭代",
    left: "离开于迭代", running: "在批次中", finished: "已完成",
    dropped: "个事件被丢弃（页面太慢）", error: "错误",
    round: "轮次", idle: "空闲",
    lessonMenu: "课程", lessonBack: "上一条", lessonNext: "下一条",
    lessonStart: "按“下一条”运行课程，直到第一个讲解点。",
    help: "静态批处理要等整批全部完成才接纳新请求；连续批处理在每次迭代都可以接纳新请求。",
    definitions: "首 token 延迟的百分位数包含仍在等待首个 token 的请求，按它们目前已等待的时间计：这是下界，标为 ≥。填充浪费：填充 token 数 / 计算的全部 token 数。",
  },
};

// [English pattern, Chinese template]; $1.. are the pattern's groups.
// The limits a speculative draft can run into (scheduler/speculative.py).
const LIMITS = { "the token budget": "token 预算", max_tokens: "max_tokens", "the context": "上下文" };

const REASONS = [
  // An admission that found part of its prompt in the prefix cache: its words, then the cache's.
  [/^(.+); (\d+) of (\d+) (?:prompt )?tokens found in the cache: (.+)$/, (m) => translateReason(m[1]) + cacheWords(m)],
  [/^admitted: (\d+)-token chunk \(recompute after preemption\) fits the remaining budget of (\d+)$/, "重新接纳（被抢占后重算）：$1 个 token 的预填充段放得进剩余预算 $2"],
  [/^admitted: (\d+)-token prompt \(recompute after preemption\) fits the remaining budget of (\d+)$/, "重新接纳（被抢占后重算）：$1 个 token 的提示词放得进剩余预算 $2"],
  [/^admitted: (\d+)-token chunk fits the remaining budget of (\d+)$/, "已接纳：$1 个 token 的预填充段放得进剩余预算 $2"],
  [/^admitted: (\d+)-token prompt fits the remaining budget of (\d+)$/, "已接纳：$1 个 token 的提示词放得进剩余预算 $2"],
  [/^admitted to a new static batch: reserves (\d+) blocks for prompt (\d+) \+ max_tokens (\d+)$/, "进入新的静态批次：为提示词 $2 + 最大输出 $3 预留 $1 个块"],
  // A KV reservation (kv_reservation other than paged), after the admission's own words.
  [/^(.+); reserves (\d+) blocks for (\d+) \+ (\d+) tokens \((.+)\)$/, (m) => `${translateReason(m[1])}；为 ${m[3]} + ${m[4]} 个 token 预留 ${m[2]} 块（${reservationWhy(m[5])}）`],
  [/^(.+); already past its reservation of (\d+) \+ (\d+) tokens \((.+)\), it grows paged$/, (m) => `${translateReason(m[1])}；已超出它 ${m[2]} + ${m[3]} 个 token 的预留（${reservationWhy(m[4])}），按分页增长`],
  [/^request (\d+) waits: needs (\d+) blocks, (\d+) free \((\w+) reservation\)$/, "请求 $1 等待：需要 $2 块，空闲 $3 块（$4 预留）"],
  [/^outgrew its (\w+) reservation \(expected_output_tokens was too small\): (\d+) more block\(s\), paged$/, "用完了它的 $1 预留（expected_output_tokens 给小了）：按分页再要 $2 块"],
  [/^finished \((\w+)\); its static batch ended$/, "已完成（$1）；它所在的静态批次结束"],
  [/^finished \((\w+)\)$/, "已完成（$1）"],
  [/^aborted by the client$/, "被客户端中止"],
  [/^preempted by (swap|recompute): (\d+) free blocks, request (\d+) needs (\d+); victim is (.+)$/, (m) => `被抢占（${m[1] === "swap" ? "换出" : "重算"}）：空闲 ${m[2]} 块，请求 ${m[3]} 需要 ${m[4]} 块；被选中的是${victim(m[5])}`],
  [/^swapped out: (\d+) blocks copied to CPU$/, "已换出：$1 个块复制到 CPU"],
  [/^swapped in: needs (\d+) blocks, (\d+) free$/, "已换入：需要 $1 块，空闲 $2 块"],
  [/^chunked prefill is off: this iteration runs whole prompts only$/, "分段预填充已关闭：本次迭代只运行完整的提示词"],
  [/^no swap-ins or admissions in an iteration that had to preempt$/, "本次迭代发生了抢占，因此不换入也不接纳"],
  [/^(\d+) row\(s\) computed and discarded: request\(s\) ([\d, ]+) had stopped in the previous iteration, learnt after this plan was made \(overlap scheduling\)$/, "$1 行已计算并丢弃：请求 $2 在上一次迭代已停止，制定本计划时尚不知道（重叠调度）"],
  [/^(\d+) running request\(s\) sit out this iteration: the token budget of (\d+) is spent$/, "$1 个运行中的请求本次迭代轮空：$2 的 token 预算已用完"],
  [/^request (\d+) stays swapped out: needs more than the (\d+) free blocks$/, "请求 $1 仍在换出状态：需要的块多于空闲的 $2 块"],
  [/^(\d+) waiting: all (\d+) slots are taken$/, "$1 个在等待：$2 个槽位全被占用"],
  [/^(\d+) waiting: the token budget is spent$/, "$1 个在等待：token 预算已用完"],
  [/^request (\d+) waits: its (\d+)-token prompt exceeds the remaining budget of (\d+)$/, "请求 $1 等待：它的 $2 个 token 的提示词超过剩余预算 $3"],
  [/^request (\d+) waits: needs (\d+) blocks, (\d+) free$/, "请求 $1 等待：需要 $2 块，空闲 $3 块"],
  [/^(\d+) waiting: a static batch admits nobody until all its (\d+) members finish$/, "$1 个在等待：静态批次要等全部 $2 个成员完成才接纳新请求"],
  [/^static batch full at (\d+) requests$/, "静态批次已满（$1 个请求）"],
  [/^static batch closed: request (\d+) would reserve (\d+) blocks, (\d+) free$/, "静态批次关闭：请求 $1 需要预留 $2 块，只有 $3 块空闲"],
  [/^the prompt is empty; give at least one token$/, "提示词为空；至少需要一个 token"],
  [/^prompt of (\d+) tokens does not fit the model's context of (\d+) tokens \(it needs room for at least one new token\)$/, "$1 个 token 的提示词放不进模型 $2 个 token 的上下文（还要留出至少一个新 token 的位置）"],
  [/^request needs up to (\d+) tokens of KV cache \(prompt (\d+) \+ max_tokens (\d+)\) but the whole pool holds (\d+) \((\d+) blocks of (\d+)\)$/, "请求最多需要 $1 个 token 的 KV 缓存（提示词 $2 + 最大输出 $3），而整个池只能容纳 $4 个（$5 个块，每块 $6 个）"],
  [/^without chunked prefill a request must fit one iteration's token budget: prompt (\d+) \+ max_tokens (\d+) exceeds max_num_batched_tokens=(\d+)$/, "关闭分段预填充时，请求必须放得进一次迭代的 token 预算：提示词 $1 + 最大输出 $2 超过了 max_num_batched_tokens=$3"],
  [/^this model folder has no tokenizer; give token ids$/, "该模型目录没有分词器；请直接给出 token id"],
  [/^token id (.+) is outside the vocabulary of (\d+) tokens$/, "token id $1 超出了 $2 个 token 的词表"],
  [/^messages is empty; give at least one message$/, "messages 为空；至少需要一条消息"],
  [/^this model has no chat template; give a plain prompt instead$/, "该模型没有对话模板；请改用普通提示词"],
  [/^drafts nothing: the n-gram of (\d+) tokens? appeared at position (\d+), but no free KV block is left for drafts$/, "不起草：长 $1 个 token 的 n-gram 之前出现在位置 $2，但已没有空闲的 KV 块可放草稿"],
  [/^drafts (\d+) tokens?: the n-gram of (\d+) tokens? appeared at position (\d+); trimmed from (\d+): the free KV blocks hold (\d+) more$/, "起草 $1 个 token：长 $2 个 token 的 n-gram 之前出现在位置 $3；从 $4 个削减：空闲的 KV 块只能再放 $5 个"],
  [/^drafts (\d+) tokens?: the n-gram of (\d+) tokens? appeared at position (\d+); (the token budget|max_tokens|the context) leaves room for (\d+)$/, (m) => `起草 ${m[1]} 个 token：长 ${m[2]} 个 token 的 n-gram 之前出现在位置 ${m[3]}；${LIMITS[m[4]]}只留得下 ${m[5]} 个`],
  [/^drafts (\d+) tokens?: the n-gram of (\d+) tokens? appeared at position (\d+)$/, "起草 $1 个 token：长 $2 个 token 的 n-gram 之前出现在位置 $3"],
  [/^request (\d+) (.+)$/, (m) => `请求 ${m[1]} ${translateReason(m[2])}`],
];

// An admission's prefix-cache words: "; 32 of 40 prompt tokens found in the cache: 2 blocks
// shared with request 7, 1 taken back from the evictable cached blocks, 1 copied back from
// the host tier".
function cacheWords(m) {
  const parts = m[4].split(/, (?=\d+ (?:blocks|taken|copied))/).map((p) => {
    const shared = p.match(/^(\d+) blocks shared with requests? (.+)$/);
    const more = shared && shared[2].match(/^(.+) and (\d+) more$/);
    if (more) return `与请求 ${more[1]} 等 ${more[1].split(", ").length + Number(more[2])} 个请求共享 ${shared[1]} 个块`;
    if (shared) return `与请求 ${shared[2]} 共享 ${shared[1]} 个块`;
    const host = p.match(/^(\d+) copied back from the host tier$/);
    if (host) return `${host[1]} 个从主机内存层拷回`;
    const back = p.match(/^(\d+) taken back from the evictable cached blocks$/);
    return back ? `${back[1]} 个取回自可回收的缓存块` : p;
  });
  return `；缓存中找到 ${m[3]} 个 token 中的 ${m[2]} 个：${parts.join("，")}`;
}

// How a reservation was chosen: "max", "pow2: 20 expected, rounded up", "oracle: ...".
function reservationWhy(why) {
  const pow2 = why.match(/^pow2: (\d+) expected, rounded up$/);
  if (pow2) return `pow2：预期 ${pow2[1]} 个，向上取整到 2 的幂`;
  if (why.startsWith("oracle")) return "oracle：正好是预期的输出长度";
  return why === "max" ? "max：按 max_tokens" : why;
}

function victim(who) {
  if (who === "the latest arrival") return "最晚到达的请求";
  if (who === "the lowest priority") return "优先级最低的请求";
  if (who.startsWith("itself")) return "它自己（没有排位更低的请求）";
  return who;
}

let lang = localStorage.getItem("minicb-lang") || "en";

export function getLang() { return lang; }

export function t(key) {
  return (STRINGS[lang] && STRINGS[lang][key]) ?? STRINGS.en[key] ?? key;
}

// A scheduler reason or a rejection message in the current language; unknown patterns stay
// as the engine wrote them.
export function translateReason(text) {
  if (lang !== "zh") return text;
  const [head, ...rest] = text.split("; swap space is full, so it falls back to recompute");
  for (const [pattern, template] of REASONS) {
    const m = head.match(pattern);
    if (!m) continue;
    const out = typeof template === "function"
      ? template(m) : template.replace(/\$(\d)/g, (_, i) => m[Number(i)]);
    return rest.length ? out + "；交换空间已满，改为重算" : out;
  }
  return text;
}

// Fill every [data-i18n] element's text and every [data-i18n-ph] placeholder.
export function applyLabels(root = document) {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  for (const el of root.querySelectorAll("[data-i18n]")) el.textContent = t(el.dataset.i18n);
  for (const el of root.querySelectorAll("[data-i18n-ph]")) el.placeholder = t(el.dataset.i18nPh);
  for (const el of root.querySelectorAll("[data-i18n-title]")) el.title = t(el.dataset.i18nTitle);
}

export function setLang(next) {
  lang = next in STRINGS ? next : "en";
  localStorage.setItem("minicb-lang", lang);
  applyLabels();
}
