"""Is a message a request to act on the machine (kill, delete, restart, run, stop, ...)?

The offline agent's tools are read-only, so such a request is refused (``answers.refusal``) before any
tool intent (``intents.parse``). Only an imperative aimed at something counts, never a question.
"""
from __future__ import annotations

import re

# ASCII matching, as ``intents`` does: \w (and so \b) would count CJK characters as word characters
_FLAGS = re.IGNORECASE | re.ASCII


def _p(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, _FLAGS)


#: a request to act on the machine (kill, delete, restart, run, stop, ...): the tools are read-only, so it is
#: refused (``answers.refusal``) before any tool intent. Only an imperative aimed at something counts
#: (``is_request_to_act``): the verb first (after "please" / "帮我" / "请"; in Chinese also first in a clause)
#: followed by what it acts on (a name, a pid, a path, a shell flag, or a system thing: a process, a service,
#: a file, the firewall, ...), or 把 <something> <verb> ("帮我把 pid 5708 的进程杀掉"), and never a question.
#: So "why did nginx stop?", "停止的进程有哪些", "show stopped containers", "run time of the backup", "nginx 重启过吗",
#: "运行中的进程有哪些", "你运行在哪台机器上", "启动项有哪些", "run queue length?" are questions, "Format the answer
#: as a table: ..." asks about the answer, and "Stop, show me the CPU usage instead" asks for the CPU usage.
_ACT_PREFIX_EN = (r"^\s*(?:(?:please|pls|kindly|can\s+you|could\s+you|would\s+you|will\s+you|go\s+ahead\s+and|just|"
                  r"i\s+want\s+you\s+to|i\s+need\s+you\s+to)\s+)*")
#: words that are no object of the verb before them: pronouns, articles, prepositions, adverbs and gerunds
#: ("start over", "stop it", "move on to ...", "run through the list", "stop talking"), and what a run, a
#: start or a stop is measured by ("run time", "restart count", "run queue")
_NOT_OBJECT_EN = (r"(?:a|an|the|me|us|you|it|them|him|her|this|that|these|those|my|your|our|their|its|all|any|and|or|"
                  r"but|so|if|then|now|here|there|again|please|instead|first|next|too|also|about|above|across|after|"
                  r"against|along|around|as|at|before|behind|below|between|beyond|by|down|during|for|from|in|inside|"
                  r"into|like|near|of|off|on|onto|out|over|past|since|through|to|toward|towards|under|until|up|upon|"
                  r"with|within|without|count|counts|time|times|reason|reasons|history|log|logs|status|queue|state|"
                  r"date|duration|length|(?!(?:every|any|some|no)thing\b)[a-z]{2,}ing)\b")
#: the system things a verb acts on when it names them after "the" / "all" and at most 3 words ("restart
#: the web server", "delete all old log files", "format the disk", "edit the nginx config file")
_SYSTEM_NOUN_EN = (r"(?:process(?:es)?|services?|daemons?|files?|folders?|director(?:y|ies)|dirs?|containers?|servers?|"
                   r"machines?|box(?:es)?|hosts?|system|computer|databases?|dbs?|tables?|firewall|ports?|pids?|jobs?|"
                   r"cron(?:tab)?s?|tasks?|scripts?|commands?|packages?|disks?|partitions?|volumes?|drives?|users?|"
                   r"accounts?|logs?|vms?|instances?|nodes?|clusters?|cache|config(?:uration)?s?)\b")
_DETERMINER_EN = r"(?:the|this|that|these|those|all|every|each|my|our|its|any|a|an)"
_MODIFIERS_EN = rf"(?:(?!{_NOT_OBJECT_EN})[\w.@+-]+\s+){{0,3}}?"
#: a path, a file name with an extension, a pid, a shell flag ("-rf", "kill -9 1234"), a quoted command
#: ("run 'reboot'", 'execute "rm -rf /"', a backtick)
_PATHLIKE_EN = r"(?:-{1,2}[A-Za-z0-9]|\d|[/~]|[\w.-]*\w\.[A-Za-z]|[\"'`“‘])"   # (a quoted command: run 'reboot')
#: verbs that act on the machine whatever they name ("kill nginx", "restart nginx", "rm -rf /tmp/x")
_ACT_VERBS_EN = (r"(?:kill|pkill|killall|terminate|delete|remove|rm|erase|wipe|purge|restart|reboot|shut\s*down|"
                 r"power\s+off|stop|start|execute|exec|run|install|uninstall|upgrade|chmod|chown|mv|move|rename|"
                 r"truncate|overwrite|systemctl|service|sudo)")
#: verbs that act on the machine only when they name a path or a system thing ("edit /etc/hosts", "format
#: the disk"; not "Format the answer as a table", "edit your reply", "change the language")
_EDIT_VERBS_EN = r"(?:format|edit|modify|write\s+to|change)"
_ACT_EN = _p(
    _ACT_PREFIX_EN + r"(?:"
    rf"{_ACT_VERBS_EN}\s+(?:{_PATHLIKE_EN}|(?!{_NOT_OBJECT_EN})[A-Za-z]|{_DETERMINER_EN}\s+{_MODIFIERS_EN}{_SYSTEM_NOUN_EN})|"
    rf"{_EDIT_VERBS_EN}\s+(?:{_PATHLIKE_EN}|(?:{_DETERMINER_EN}\s+)?{_MODIFIERS_EN}{_SYSTEM_NOUN_EN})|"
    r"(?:reboot|shut\s*down|power\s+off)(?:\s+now)?\s*[.!]*\s*$)")
_QUESTION_WORD_EN = _p(r"\b(?:what|which|why|how|where|who|whose)\b")
_POLITE_EN = _p(r"^\s*(?:please\s+)?(?:can|could|would|will)\s+you\b")

#: a Chinese request starts the message or a clause ("nginx 挂了，帮我重启 nginx")
_ACT_PREFIX_ZH = r"(?:^|[，,。；;！!])\s*(?:请|麻烦你?|帮我|帮忙|给我|你|能不能|能否|可以|可不可以|可否|马上|立刻|立即|现在|赶紧)*\s*"
_ACT_VERBS_ZH = (r"(?:杀掉|杀死|杀|干掉|删除|删掉|删|移除|清空|清理|重新启动|重启|执行|停止运行|运行|停止|停掉|关闭|关掉|"
                 r"结束|终止|卸载|安装|修改|改写|覆盖|格式化|启动)")
#: what after a verb makes it no request: a noun or a state it forms ("运行时间", "启动项", "执行记录", "重启次数",
#: "运行中", "运行在", "运行最久", "停止运行的", "启动失败的服务"), a past ("重启过", "停止了")
_NOT_ACT_AFTER_ZH = (r"(?!\s*(?:的|过|了|着|中|在|最|项|完|时|期间|次数|原因|记录|日志|状态|情况|多久|运行|起来|方式|方法|"
                     r"失败|成功|异常|报错|出错|超时|响应))")
#: the nouns an install / run / start verb forms with what follows ("安装目录", "运行环境", "启动参数"): no request
_NOT_ACT_NOUN_ZH = r"(?!(?:安装|运行|启动)(?:目录|路径|位置|顺序|参数|环境|用户))"
#: the system things a Chinese verb acts on, at most 16 characters after it ("关闭防火墙", "删除所有临时文件"),
#: or a name, a pid, a path or a flag in Latin letters or digits ("停止 nginx 服务", "重启一下 nginx")
_SYSTEM_NOUN_ZH = (r"(?:进程|服务|文件|目录|文件夹|防火墙|机器|服务器|系统|电脑|主机|容器|数据库|数据表|端口|缓存|任务|程序|脚本|"
                   r"软件|应用|网卡|磁盘|硬盘|分区|用户|账号|账户|回收站|连接)")
_ACT_ZH = _p(
    _ACT_PREFIX_ZH + rf"(?:{_NOT_ACT_NOUN_ZH}{_ACT_VERBS_ZH}{_NOT_ACT_AFTER_ZH}\s*(?:一下|掉)?\s*"
    rf"(?:[A-Za-z0-9/~.\-_]|[^，。？！,.?!；;：:]{{0,16}}?{_SYSTEM_NOUN_ZH})|"
    r"关机\s*[。！!吧]*\s*$|"
    r"把.{1,60}?(?:杀掉|杀死|干掉|删除|删掉|删了|移除|清空|清理掉?|重启|停止|停掉|关闭|关掉|结束掉?|终止|卸载|执行|运行)"
    rf"{_NOT_ACT_AFTER_ZH})")
_QUESTION_WORD_ZH = _p(r"哪|什么|啥|怎么|怎样|如何|为什么|为何|多少|是否|有没有|有几")
_POLITE_ZH = _p(r"^\s*(?:请|麻烦你?)?\s*你?\s*(?:能不能|能否|可以|可不可以|可否|能)")
#: how a question ends ("nginx 重启了吗", "run queue length?"); a polite request ("can you delete app.log?",
#: "可以帮我重启 nginx 吗") ends so too and is still one
_ASKED_END = _p(r"[?？吗呢么]\s*[。.!！]*\s*$")


def is_request_to_act(text: str) -> bool:
    """``text`` asks the assistant to act on the machine (``_ACT_EN`` / ``_ACT_ZH``) and is no question:
    no question word ("哪", "什么", "有哪些", "which", "what"), and no final "?" / "？" / 吗 / 呢 unless
    the request is a polite one ("can you ...?", "可以…吗")."""
    if _ACT_EN.search(text):
        asked, polite = _QUESTION_WORD_EN, _POLITE_EN
    elif _ACT_ZH.search(text):
        asked, polite = _QUESTION_WORD_ZH, _POLITE_ZH
    else:
        return False
    if asked.search(text):
        return False
    return not _ASKED_END.search(text) or polite.search(text) is not None
