// tercel's Thrift service: wire-compatible with Kestrel 2.4's `Kestrel` service
// (framed transport, binary protocol). Generate a client from this file with any Thrift
// compiler or load it with thriftpy2; docs/protocol.md, "Thrift", documents every method.

namespace java net.lag.kestrel.thrift
namespace py kestrel

struct Item {
  // The item's bytes, exactly as they were put (by any protocol).
  1: binary data
  // The reservation id to confirm or abort; 0 for an item taken for good.
  2: i64 id
}

struct QueueInfo {
  // The item at the head of the queue, when there is one (it is not taken).
  1: optional binary head_item
  // Items waiting in the queue (reserved items are not counted).
  2: i64 items
  // Payload bytes of those items.
  3: i64 bytes
  // Bytes of the queue's journal files on disk.
  4: i64 journal_bytes
  // Milliseconds since the last item taken was added (0 when the queue is empty).
  5: i64 age
  // Readers blocked on the queue.
  6: i32 waiters
  // Items taken but neither confirmed nor aborted yet.
  7: i32 open_transactions
}

// tercel's: what put_keyed stored (docs/protocol.md, "Dedup keys").
struct PutResult {
  // The item's id; 0 when the queue refused the item (full: nothing stored).
  1: i64 item_id
  // True when an earlier put with the key, within the queue's dedup_window_ms, stored the
  // item: this one stored nothing and item_id is the original's.
  2: bool duplicate
}

enum Status {
  NOT_CONFIGURED = 0,
  QUIESCENT = 1,
  READ_ONLY = 2,
  UP = 3,
}

service Kestrel {
  // Add items in order; stops at the first refused item. Returns how many were added, each
  // journaled before the reply. expiration_msec is relative; 0 means the items never expire.
  i32 put(1: string queue_name, 2: list<binary> items, 3: i32 expiration_msec = 0)

  // Take up to max_items. timeout_msec 0 returns what is there now; otherwise waits until
  // max_items arrived or the timeout passed. auto_abort_msec > 0 reserves the items: each
  // has an id to confirm or abort, from any connection, before that many milliseconds,
  // after which it returns to the queue. auto_abort_msec 0 takes them for good (id 0).
  list<Item> get(1: string queue_name, 2: i32 max_items, 3: i32 timeout_msec = 0, 4: i32 auto_abort_msec = 0)

  // Confirm reserved items by id; returns how many ids were found.
  i32 confirm(1: string queue_name, 2: set<i64> ids)

  // Return reserved items to the head of their queue; returns how many ids were found.
  i32 abort(1: string queue_name, 2: set<i64> ids)

  // The queue's counters and its head item (not taken).
  QueueInfo peek(1: string queue_name)

  // Drop every waiting item of one queue.
  void flush_queue(1: string queue_name)

  // Drop every waiting item of every queue.
  void flush_all_queues()

  // Delete a queue and its journal.
  void delete_queue(1: string queue_name)

  // The server's status.
  Status current_status()

  // Change the server's status (NOT_CONFIGURED is refused).
  void set_status(1: Status status)

  // The server's version string.
  string get_version()

  // tercel's: log in as a user of the server's [users] (docs/protocol.md, "Users"). On a
  // server with users every other call before it fails with a TApplicationException
  // ("unauthenticated: ..."); wrong credentials fail with "authentication failure".
  void auth(1: string user, 2: string password)

  // tercel's: put one item with a dedup key (docs/protocol.md, "Dedup keys"): a put that
  // timed out can be sent again with the same key and lands once. A bad key, an alias or a
  // fanout_only queue fail with a TApplicationException naming the rule; so does a queue
  // holding max_dedup_keys keys younger than its window.
  PutResult put_keyed(1: string queue_name, 2: binary item, 3: string key, 4: i32 expiration_msec = 0)
}
