"""Throwaway TLS material made with openssl (EC P-256, valid 2 days), for the tests that start
servers with certificates of their own names (tests/security/make_test_certs.sh makes the fixed
set the security tests use)."""
import os
import subprocess

KEY = ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"]


def _ossl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {r.stderr.strip()[-500:]}")


def make_ca(dirname, cn):
    """dirname/ca.pem and ca.key."""
    os.makedirs(dirname, exist_ok=True)
    _ossl(*KEY, "ca.key", cwd=dirname)
    _ossl("req", "-x509", "-new", "-key", "ca.key", "-subj", f"/CN={cn}", "-days", "2", "-out",
          "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
          "keyUsage=critical,keyCertSign,cRLSign", cwd=dirname)


def issue_leaf(dirname, name, cn, extensions):
    """dirname/NAME.pem and NAME.key signed by dirname's ca.pem; extensions: openssl's
    extension lines (subjectAltName=..., extendedKeyUsage=...)."""
    _ossl(*KEY, f"{name}.key", cwd=dirname)
    _ossl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={cn}", "-out", f"{name}.csr",
          cwd=dirname)
    with open(os.path.join(dirname, f"{name}.ext"), "w") as f:
        f.write(extensions + "\nbasicConstraints=CA:FALSE\n")
    _ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
          "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
          cwd=dirname)
    for scratch in (f"{name}.csr", f"{name}.ext"):
        os.remove(os.path.join(dirname, scratch))


def make_host_certs(dirname, hosts):
    """ca.pem, and per host NAME.pem / NAME.key with subjectAltName IP:ADDRESS, good for serving
    and for connecting (a worker is the coordinator's client and its peers' server), and
    `token`, a job API token. hosts: {name: address}."""
    make_ca(dirname, "adjsh-hosts-ca")
    for name, addr in hosts.items():
        issue_leaf(dirname, name, f"adjsh-{name}",
                   f"subjectAltName=IP:{addr}\nextendedKeyUsage=serverAuth,clientAuth")
    with open(os.path.join(dirname, "token"), "w") as f:
        f.write(os.urandom(16).hex() + "\n")
    os.chmod(os.path.join(dirname, "token"), 0o600)
