/* The pod sandbox's process (what registry.k8s.io/pause runs): hold the pod's namespaces, exit
 * on SIGTERM or SIGINT. Built static by gcc, so its image needs no libc. */
#include <signal.h>
#include <unistd.h>

static void done(int sig) { (void)sig; _exit(0); }

int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
