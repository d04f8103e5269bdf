// final_barrier: nodes left waiting in barriers for good, for a test that
// kills the scheduler under them (written against ps:: only). Every
// server and worker 0 call Finalize(0, B) at once: with B (-barrier 1,
// the default) they wait in its barrier over every node, without it in
// libfpt's final barrier. Worker 1 instead waits in a barrier of the
// workers, which worker 0 never enters. Nobody can pass: each prints
// "waiting" and waits until the cluster fails (the scheduler dies), which
// must end it with status 1 and the reason, never leave it waiting.
//
//   final_barrier [-barrier 0|1]

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ps/ps.h"

using namespace ps;

int main(int argc, char* argv[]) {
  bool barrier = true;
  if (argc == 3 && !std::strcmp(argv[1], "-barrier")) barrier = std::atoi(argv[2]) != 0;
  Start(0);
  if (IsScheduler()) {
    Finalize(0, true);
    std::printf("scheduler: done\n");
    return 0;
  }
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(KVServerDefaultHandle<float>());
  }
  if (IsWorker() && MyRank() == 1) {
    std::printf("waiting in a barrier of the workers\n");
    std::fflush(stdout);
    Postoffice::Get()->Barrier(0, kWorkerGroup);
    std::printf("worker 1 passed its barrier\n");
    return 0;
  }
  std::printf("waiting in the final barrier\n");
  std::fflush(stdout);
  Finalize(0, barrier);
  std::printf("passed the final barrier\n");
  delete server;
  return 0;
}
