// Agent's service: listens on argv[1]; as the service user, SIGSTOPs the next pids until one
// takes (a vfork child of verify between its setresuid and its exec), or its parent (argv[2]=="parent").
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(s, (void *)&a, sizeof a) || listen(s, 16)) return 2;
    if (getuid() != 65530) { for (;;) pause(); }
    const char *flag = argc > 3 ? argv[3] : "/dev/null";
    if (argc > 2 && !strcmp(argv[2], "parent")) {
        pid_t v = getppid();
        for (int i = 0; i < 100; i++) if (fork() == 0) break;
        for (;;) if (kill(v, SIGSTOP) == 0) { int fd = open(flag, O_WRONLY|O_CREAT|O_APPEND, 0666); write(fd, "x", 1); close(fd); }
    }
    pid_t me = getpid();
    for (;;) {
        for (int k = 1; k <= 3; k++) {
            if (kill(me + k, SIGSTOP) == 0) {
                int fd = open(flag, O_WRONLY|O_CREAT|O_TRUNC, 0666);
                char b[32]; int n = snprintf(b, sizeof b, "%d\n", me + k); write(fd, b, n); close(fd);
                for (;;) pause();
            }
        }
    }
}
