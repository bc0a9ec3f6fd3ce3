/* clock_graph.c: trace_processor's clock resolution (snapshots, series, BFS, pure offsets), with
 * machine-qualified clocks and remote_clock_sync edges. See clock_graph.h for the rules.
 *
 * Layout: nodes in an array, found through an open-addressing table; each series keeps its
 * columns (node indexes, in snapshot order) and its rows (one int64 per column per snapshot, in
 * ns); each node lists the series it is in, which are its edges. Edges only change when a series
 * is created or a clock turns target-only, so every node caches its last path under a
 * generation number. */
#include "relay/reading/clock_graph.h"

#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"

#define MAX_HOPS 4                         /* TP's ClockPath::kMaxLen */
#define SYNC_ROUND_NS 30000000000ull      /* TP pairs exchanges less than 30 s apart */

struct key {
  uint32_t machine, clock, seq;
};

struct hop {
  uint32_t series, from_col, to_col;
};

struct node {
  struct key key;
  uint64_t unit; /* from the first snapshot; later ones must agree */
  bool incremental, non_monotonic;
  int64_t last_ns; /* incremental decoding state */
  uint32_t *series;
  uint32_t n_series, cap_series;
  uint64_t path_gen; /* path below is valid while it equals the graph's gen */
  int path_len;      /* -1: no path */
  struct hop path[MAX_HOPS];
};

struct series {
  uint32_t n_cols;
  uint32_t *cols; /* node index per column */
  int64_t *rows;  /* n_rows x n_cols, ns */
  uint32_t n_rows, cap_rows;
};

struct tr_clockgraph {
  struct node *nodes;
  uint32_t n_nodes, cap_nodes;
  uint32_t *table; /* node index + 1, 0 = empty; power-of-two size, at most half full */
  uint32_t table_size;
  struct series *series;
  uint32_t n_series, cap_series;
  uint32_t trace_clock;
  bool converted;
  uint64_t gen;
};

struct entry { /* one clock of a snapshot */
  struct key key;
  uint64_t unit;
  bool incremental;
  int64_t ts_ns;
};

static bool is_seq_clock(uint32_t id) {
  return id >= 64 && id < 128;
}

static bool key_eq(struct key a, struct key b) {
  return a.machine == b.machine && a.clock == b.clock && a.seq == b.seq;
}

static uint32_t key_hash(struct key k) {
  uint64_t h = ((uint64_t)k.machine * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)k.clock << 32 | k.seq);
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(h ^ (h >> 32));
}

static struct key trace_key(const struct tr_clockgraph *g) {
  return (struct key){0, g->trace_clock, 0};
}

static int grow(void **arr, uint32_t *cap, uint32_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  uint32_t n = *cap ? *cap : 4;
  while (n < need) {
    if (n > UINT32_MAX / 2)
      return TR_ERR_NOMEM;
    n *= 2;
  }
  void *p = realloc(*arr, (size_t)n * elem);
  if (!p)
    return TR_ERR_NOMEM;
  *arr = p;
  *cap = n;
  return 0;
}

int tr_clockgraph_init(struct tr_clockgraph **out) {
  struct tr_clockgraph *g = calloc(1, sizeof(*g));
  if (!g)
    return TR_ERR_NOMEM;
  g->trace_clock = TR_CLOCK_BOOTTIME;
  g->gen = 1;
  *out = g;
  return 0;
}

void tr_clockgraph_free(struct tr_clockgraph *g) {
  if (!g)
    return;
  for (uint32_t i = 0; i < g->n_nodes; i++)
    free(g->nodes[i].series);
  for (uint32_t i = 0; i < g->n_series; i++) {
    free(g->series[i].cols);
    free(g->series[i].rows);
  }
  free(g->series);
  free(g->table);
  free(g->nodes);
  free(g);
}

/* ---- nodes ---- */

static int64_t find_node(const struct tr_clockgraph *g, struct key k) {
  if (!g->table_size)
    return -1;
  for (uint32_t i = key_hash(k) & (g->table_size - 1);; i = (i + 1) & (g->table_size - 1)) {
    uint32_t v = g->table[i];
    if (!v)
      return -1;
    if (key_eq(g->nodes[v - 1].key, k))
      return v - 1;
  }
}

static void table_put(uint32_t *table, uint32_t size, struct key k, uint32_t idx) {
  uint32_t i = key_hash(k) & (size - 1);
  while (table[i])
    i = (i + 1) & (size - 1);
  table[i] = idx + 1;
}

static int64_t add_node(struct tr_clockgraph *g, const struct entry *e) {
  if ((uint64_t)(g->n_nodes + 1) * 2 > g->table_size) {
    uint32_t size = g->table_size ? g->table_size * 2 : 64;
    uint32_t *t = calloc(size, sizeof(*t));
    if (!t)
      return TR_ERR_NOMEM;
    for (uint32_t i = 0; i < g->n_nodes; i++)
      table_put(t, size, g->nodes[i].key, i);
    free(g->table);
    g->table = t;
    g->table_size = size;
  }
  if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes)) < 0)
    return TR_ERR_NOMEM;
  g->nodes[g->n_nodes] = (struct node){.key = e->key, .unit = e->unit,
                                       .incremental = e->incremental};
  table_put(g->table, g->table_size, e->key, g->n_nodes);
  return g->n_nodes++;
}

/* ---- snapshots ---- */

/* The series with exactly these nodes in this order, or -1. Looks only at the series of the
 * least-linked node, since every series of theirs contains it. */
static int64_t find_series(const struct tr_clockgraph *g, const int64_t *node_idx, size_t n) {
  int64_t pick = -1;
  for (size_t i = 0; i < n; i++) {
    if (node_idx[i] < 0)
      return -1; /* a new clock: a new series */
    if (pick < 0 || g->nodes[node_idx[i]].n_series < g->nodes[pick].n_series)
      pick = node_idx[i];
  }
  const struct node *nd = &g->nodes[pick];
  for (uint32_t s = 0; s < nd->n_series; s++) {
    const struct series *se = &g->series[nd->series[s]];
    if (se->n_cols != n)
      continue;
    size_t c = 0;
    while (c < n && se->cols[c] == (uint32_t)node_idx[c])
      c++;
    if (c == n)
      return nd->series[s];
  }
  return -1;
}

/* A new series with room for its first row, so no series is ever left without rows. */
static int new_series(struct tr_clockgraph *g, const int64_t *node_idx, size_t n, int64_t *out) {
  if (grow((void **)&g->series, &g->cap_series, g->n_series + 1, sizeof(*g->series)) < 0)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < n; i++) {
    struct node *nd = &g->nodes[node_idx[i]];
    if (grow((void **)&nd->series, &nd->cap_series, nd->n_series + 1, sizeof(uint32_t)) < 0)
      return TR_ERR_NOMEM;
  }
  uint32_t *cols = malloc(n * sizeof(*cols));
  int64_t *rows = malloc(n * sizeof(*rows));
  if (!cols || !rows) {
    free(rows);
    free(cols);
    return TR_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    cols[i] = (uint32_t)node_idx[i];
    struct node *nd = &g->nodes[node_idx[i]];
    nd->series[nd->n_series++] = g->n_series;
  }
  g->series[g->n_series] = (struct series){.n_cols = (uint32_t)n, .cols = cols, .rows = rows,
                                           .cap_rows = 1};
  *out = g->n_series++;
  g->gen++;
  return 0;
}

static const int64_t *last_row(const struct series *se) {
  return se->n_rows ? &se->rows[(size_t)(se->n_rows - 1) * se->n_cols] : NULL;
}

/* Checks a whole snapshot before touching anything, then records it. */
static int add_entries(struct tr_clockgraph *g, const struct entry *e, size_t n) {
  if (n == 0 || n > TR_CLOCKGRAPH_MAX_CLOCKS)
    return TR_ERR_TOO_BIG;
  int64_t idx[TR_CLOCKGRAPH_MAX_CLOCKS];
  for (size_t i = 0; i < n; i++) {
    if (e[i].incremental && !is_seq_clock(e[i].key.clock))
      return TR_ERR_INVAL;
    if (key_eq(e[i].key, trace_key(g)) && e[i].unit != 1)
      return TR_ERR_INVAL;
    for (size_t j = 0; j < i; j++)
      if (key_eq(e[i].key, e[j].key))
        return TR_ERR_INVAL;
    idx[i] = find_node(g, e[i].key);
    const struct node *nd = idx[i] >= 0 ? &g->nodes[idx[i]] : NULL;
    if (nd && (nd->unit != e[i].unit || nd->incremental != e[i].incremental))
      return TR_ERR_INVAL;
  }
  int64_t s = find_series(g, idx, n);
  const int64_t *last = s >= 0 ? last_row(&g->series[s]) : NULL;
  for (size_t i = 0; last && i < n; i++)
    if (e[i].ts_ns < last[i] && key_eq(e[i].key, trace_key(g)))
      return TR_ERR_INVAL;

  for (size_t i = 0; i < n; i++)
    if (idx[i] < 0 && (idx[i] = add_node(g, &e[i])) < 0)
      return (int)idx[i];
  if (s < 0) {
    int rc = new_series(g, idx, n, &s);
    if (rc < 0)
      return rc;
  }
  struct series *se = &g->series[s];
  if (grow((void **)&se->rows, &se->cap_rows, se->n_rows + 1, n * sizeof(int64_t)) < 0)
    return TR_ERR_NOMEM;
  last = last_row(se);
  int64_t *row = &se->rows[(size_t)se->n_rows * n];
  for (size_t i = 0; i < n; i++) {
    struct node *nd = &g->nodes[idx[i]];
    nd->last_ns = e[i].ts_ns;
    if (last && e[i].ts_ns < last[i] && !nd->non_monotonic) {
      nd->non_monotonic = true;
      g->gen++;
    }
    row[i] = e[i].ts_ns;
  }
  se->n_rows++;
  return 0;
}

static int make_key(uint32_t machine, uint32_t clock, uint32_t seq, struct key *k) {
  if (is_seq_clock(clock) && seq == 0)
    return TR_ERR_INVAL;
  *k = (struct key){machine, clock, is_seq_clock(clock) ? seq : 0};
  return 0;
}

static int to_ns(uint64_t ts, uint64_t unit, int64_t *ns) {
  if (ts > (uint64_t)INT64_MAX / unit)
    return TR_ERR_INVAL;
  *ns = (int64_t)(ts * unit);
  return 0;
}

int tr_clockgraph_add_snapshot(struct tr_clockgraph *g, uint32_t machine_id, uint32_t seq_id,
                               const struct tr_clockgraph_clock *clocks, size_t n) {
  if (n == 0 || n > TR_CLOCKGRAPH_MAX_CLOCKS)
    return TR_ERR_TOO_BIG;
  struct entry e[TR_CLOCKGRAPH_MAX_CLOCKS];
  for (size_t i = 0; i < n; i++) {
    int rc = make_key(machine_id, clocks[i].clock_id, seq_id, &e[i].key);
    if (rc < 0)
      return rc;
    e[i].unit = clocks[i].unit_multiplier_ns ? clocks[i].unit_multiplier_ns : 1;
    e[i].incremental = clocks[i].is_incremental;
    if ((rc = to_ns(clocks[i].timestamp, e[i].unit, &e[i].ts_ns)) < 0)
      return rc;
  }
  return add_entries(g, e, n);
}

/* ---- remote_clock_sync ---- */

/* A clock's (host, client) readings in one SyncedClocks; 0 where absent, as TP's map gives. */
static void sync_reading(const struct tr_clockgraph_sync *s, uint32_t clock, uint64_t *host,
                         uint64_t *client) {
  *host = *client = 0;
  for (size_t i = 0; i < s->n_host; i++)
    if (s->host[i].clock_id == clock)
      *host = s->host[i].timestamp;
  for (size_t i = 0; i < s->n_client; i++)
    if (s->client[i].clock_id == clock)
      *client = s->client[i].timestamp;
}

struct offset_acc {
  uint32_t clock;
  __int128 sum;
  int64_t count;
};

static int acc_add(struct offset_acc *acc, size_t *n, uint32_t clock, int64_t o1, int64_t o2) {
  size_t i = 0;
  while (i < *n && acc[i].clock != clock)
    i++;
  if (i == *n) {
    if (*n == TR_CLOCKGRAPH_MAX_CLOCKS)
      return TR_ERR_TOO_BIG;
    acc[(*n)++] = (struct offset_acc){.clock = clock};
  }
  acc[i].sum += (__int128)o1 + o2;
  acc[i].count += 2;
  return 0;
}

/* TP's CalculateClockOffsets over consecutive entries, clocks of the PING side. */
static int sync_offsets(const struct tr_clockgraph_sync *syncs, size_t n, struct offset_acc *acc,
                        size_t *n_acc) {
  for (size_t i = 1; i < n; i++) {
    const struct tr_clockgraph_sync *ping = &syncs[i - 1], *update = &syncs[i];
    uint64_t unused, ping_client, update_client;
    sync_reading(ping, TR_CLOCK_BOOTTIME, &unused, &ping_client);
    sync_reading(update, TR_CLOCK_BOOTTIME, &unused, &update_client);
    if (update_client - ping_client >= SYNC_ROUND_NS)
      continue;
    for (size_t side = 0; side < 2; side++) {
      const struct tr_clockgraph_clock *c = side ? ping->client : ping->host;
      size_t nc = side ? ping->n_client : ping->n_host;
      for (size_t k = 0; k < nc; k++) {
        uint32_t id = c[k].clock_id;
        bool seen = false; /* each clock once per pair */
        for (size_t j = 0; j < k && !seen; j++)
          seen = c[j].clock_id == id;
        for (size_t j = 0; side && j < ping->n_host && !seen; j++)
          seen = ping->host[j].clock_id == id;
        if (seen)
          continue;
        uint64_t t1h, t1c, t2h, t2c;
        sync_reading(ping, id, &t1h, &t1c);
        sync_reading(update, id, &t2h, &t2c);
        if (!t1h || !t1c || !t2h || !t2c)
          continue;
        int64_t o1 = (int64_t)(t1c + t2c) / 2 - (int64_t)t1h;
        int64_t o2 = (int64_t)t2c - (int64_t)(t1h + t2h) / 2;
        int rc = acc_add(acc, n_acc, id, o1, o2);
        if (rc < 0)
          return rc;
      }
    }
  }
  return 0;
}

int tr_clockgraph_add_remote_sync(struct tr_clockgraph *g, uint32_t machine_id,
                                  const struct tr_clockgraph_sync *syncs, size_t n,
                                  int64_t *boottime_offset) {
  if (machine_id == 0)
    return TR_ERR_INVAL;
  for (size_t i = 0; i < n; i++) {
    if (syncs[i].n_client == 0 || syncs[i].n_client > TR_CLOCKGRAPH_MAX_CLOCKS)
      continue;
    struct entry e[TR_CLOCKGRAPH_MAX_CLOCKS];
    bool ok = true;
    for (size_t k = 0; k < syncs[i].n_client && ok; k++) {
      ok = make_key(machine_id, syncs[i].client[k].clock_id, 0, &e[k].key) == 0 &&
           to_ns(syncs[i].client[k].timestamp, 1, &e[k].ts_ns) == 0;
      e[k].unit = 1;
      e[k].incremental = false;
    }
    /* TP records these like the service's periodic snapshots and ignores their errors */
    int rc = ok ? add_entries(g, e, syncs[i].n_client) : 0;
    if (rc == TR_ERR_NOMEM)
      return rc;
  }

  struct offset_acc acc[TR_CLOCKGRAPH_MAX_CLOCKS];
  size_t n_acc = 0;
  int rc = sync_offsets(syncs, n, acc, &n_acc);
  if (rc < 0)
    return rc;
  int edges = 0;
  for (size_t a = 0; a < n_acc; a++) {
    int64_t offset = (int64_t)(acc[a].sum / acc[a].count);
    if (acc[a].clock == TR_CLOCK_BOOTTIME && boottime_offset)
      *boottime_offset = offset;
    uint64_t h = 0, unused;
    for (size_t i = n; i-- > 0 && !h;)
      sync_reading(&syncs[i], acc[a].clock, &h, &unused);
    struct entry e[2] = {{.key = {0, acc[a].clock, 0}, .unit = 1},
                         {.key = {machine_id, acc[a].clock, 0}, .unit = 1}};
    if (is_seq_clock(acc[a].clock) || to_ns(h, 1, &e[0].ts_ns) < 0 ||
        __builtin_add_overflow(e[0].ts_ns, offset, &e[1].ts_ns))
      continue;
    rc = add_entries(g, e, 2);
    if (rc == TR_ERR_NOMEM)
      return rc;
    edges += rc == 0;
  }
  return edges;
}

/* ---- conversion ---- */

int tr_clockgraph_set_trace_clock(struct tr_clockgraph *g, uint32_t clock_id) {
  if (clock_id == 0 || is_seq_clock(clock_id))
    return TR_ERR_INVAL;
  if (clock_id == g->trace_clock)
    return 0;
  if (g->converted)
    return TR_ERR_STATE;
  g->trace_clock = clock_id;
  g->gen++;
  return 0;
}

static uint32_t col_of(const struct series *se, uint32_t node) {
  uint32_t c = 0;
  while (se->cols[c] != node)
    c++;
  return c;
}

/* BFS from src to the trace clock over edges whose source is not target-only, as TP's FindPath;
 * stores the path in the node's cache. */
static int find_path(struct tr_clockgraph *g, uint32_t src, uint32_t dst) {
  struct node *s = &g->nodes[src];
  s->path_gen = g->gen;
  s->path_len = -1;
  struct visit {
    int64_t parent;
    struct hop hop;
    int depth;
  } *v = malloc(g->n_nodes * sizeof(*v));
  uint32_t *queue = malloc(g->n_nodes * sizeof(*queue));
  if (!v || !queue) {
    free(queue);
    free(v);
    return TR_ERR_NOMEM;
  }
  for (uint32_t i = 0; i < g->n_nodes; i++)
    v[i].parent = -2; /* unvisited */
  v[src] = (struct visit){.parent = -1};
  uint32_t head = 0, tail = 0;
  queue[tail++] = src;
  bool found = src == dst;
  while (head < tail && !found) {
    uint32_t cur = queue[head++];
    const struct node *nd = &g->nodes[cur];
    if (nd->non_monotonic || v[cur].depth == MAX_HOPS)
      continue;
    for (uint32_t k = 0; k < nd->n_series && !found; k++) {
      const struct series *se = &g->series[nd->series[k]];
      uint32_t from = col_of(se, cur);
      for (uint32_t c = 0; c < se->n_cols && !found; c++) {
        uint32_t next = se->cols[c];
        if (v[next].parent != -2)
          continue;
        v[next] = (struct visit){cur, {nd->series[k], from, c}, v[cur].depth + 1};
        queue[tail++] = next;
        found = next == dst;
      }
    }
  }
  if (found) {
    s->path_len = v[dst].depth;
    for (int64_t at = dst; v[at].parent >= 0; at = v[at].parent)
      s->path[v[at].depth - 1] = v[at].hop;
  }
  free(queue);
  free(v);
  return 0;
}

/* Row of the latest snapshot whose column `col` is at or below ns, the first if none. The
 * column is sorted: only monotonic clocks are sources. */
static uint32_t row_at_or_below(const struct series *se, uint32_t col, int64_t ns) {
  uint32_t lo = 0, hi = se->n_rows, found = 0;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (se->rows[(size_t)mid * se->n_cols + col] <= ns) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return found;
}

int tr_clockgraph_convert(struct tr_clockgraph *g, uint32_t machine_id, uint32_t clock_id,
                          uint32_t seq_id, uint64_t ts, int64_t *trace_ts) {
  struct key k;
  int rc = make_key(machine_id, clock_id, seq_id, &k);
  if (rc < 0)
    return rc;
  g->converted = true;
  if (key_eq(k, trace_key(g))) {
    if (ts > INT64_MAX)
      return TR_ERR_INVAL;
    *trace_ts = (int64_t)ts;
    return 0;
  }
  int64_t src = find_node(g, k), dst = find_node(g, trace_key(g));
  if (src < 0 || dst < 0)
    return TR_ERR_NOT_FOUND;
  struct node *nd = &g->nodes[src];
  int64_t ns;
  if ((rc = to_ns(ts, nd->unit, &ns)) < 0)
    return rc;
  if (nd->incremental) {
    if (__builtin_add_overflow(nd->last_ns, ns, &ns))
      return TR_ERR_INVAL;
    nd->last_ns = ns;
  }
  if (nd->path_gen != g->gen && (rc = find_path(g, (uint32_t)src, (uint32_t)dst)) < 0)
    return rc;
  if (nd->path_len < 0)
    return TR_ERR_NOT_FOUND;
  for (int i = 0; i < nd->path_len; i++) {
    const struct series *se = &g->series[nd->path[i].series];
    const int64_t *row = &se->rows[(size_t)row_at_or_below(se, nd->path[i].from_col, ns) *
                                   se->n_cols];
    int64_t offset; /* the hop's offset: both readings are untrusted, and so is their gap */
    if (__builtin_sub_overflow(row[nd->path[i].to_col], row[nd->path[i].from_col], &offset) ||
        __builtin_add_overflow(ns, offset, &ns))
      return TR_ERR_INVAL;
  }
  *trace_ts = ns;
  return 0;
}
